// Stand-in for <poplar/Type.hpp> (Graphcore Poplar SDK), for syntax checking
// host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_TYPE_HPP
#define TILEPLAN_STANDIN_POPLAR_TYPE_HPP

#include <string>

namespace poplar {

// A device element type. Sizes on the IPU: UNSIGNED_CHAR 1, HALF 2, FLOAT 4 bytes.
class Type {
public:
  Type();
  const std::string &toString() const;
  bool operator==(const Type &other) const;
  bool operator!=(const Type &other) const;
};

extern Type BOOL;
extern Type CHAR;
extern Type UNSIGNED_CHAR;
extern Type SIGNED_CHAR;
extern Type SHORT;
extern Type UNSIGNED_SHORT;
extern Type INT;
extern Type UNSIGNED_INT;
extern Type HALF;
extern Type FLOAT;

}  // namespace poplar

#endif

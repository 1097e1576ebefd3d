// Stand-in for <poplar/GraphElements.hpp> (Graphcore Poplar SDK): compute
// sets, vertex and field references. For syntax checking host programs only;
// see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_GRAPHELEMENTS_HPP
#define TILEPLAN_STANDIN_POPLAR_GRAPHELEMENTS_HPP

#include <cstddef>

#include <poplar/StandIn.hpp>

namespace poplar {

class ComputeSet {
public:
  ComputeSet();
  unsigned getId() const;
};

class FieldRef {
public:
  FieldRef();
  FieldRef operator[](std::size_t index) const;
};

class VertexRef {
public:
  VertexRef();
  FieldRef operator[](StringRef fieldName) const;
  unsigned getId() const;
};

}  // namespace poplar

#endif

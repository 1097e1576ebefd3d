// Stand-in for <poplar/Target.hpp> (Graphcore Poplar SDK), for syntax checking
// host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_TARGET_HPP
#define TILEPLAN_STANDIN_POPLAR_TARGET_HPP

#include <poplar/Type.hpp>

namespace poplar {

enum class TargetType { IPU, IPU_MODEL, CPU };

// The description of a device the graph is built for.
class Target {
public:
  Target();
  TargetType getTargetType() const;
  unsigned getNumIPUs() const;
  unsigned getTilesPerIPU() const;
  unsigned getNumWorkerContexts() const;
  unsigned getBytesPerTile() const;
  unsigned getNumTiles() const;
  unsigned getTypeSize(const Type &type) const;
};

}  // namespace poplar

#endif

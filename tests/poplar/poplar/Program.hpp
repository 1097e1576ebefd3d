// Stand-in for <poplar/Program.hpp> (Graphcore Poplar SDK), for syntax
// checking host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_PROGRAM_HPP
#define TILEPLAN_STANDIN_POPLAR_PROGRAM_HPP

#include <initializer_list>

#include <poplar/DataStream.hpp>
#include <poplar/GraphElements.hpp>
#include <poplar/StandIn.hpp>
#include <poplar/Tensor.hpp>

namespace poplar {

// <poplar/SyncType.hpp>: which tiles a Sync waits for (GLOBAL: every tile of every IPU, and the host).
enum class SyncType { INTERNAL, EXTERNAL, GLOBAL };

namespace program {

class Program {
public:
  Program();
  bool isEmpty() const;
};

// Run the programs in order.
class Sequence : public Program {
public:
  Sequence(const DebugContext &debugContext = {});
  Sequence(std::initializer_list<Program> programs, const DebugContext &debugContext = {});
  void add(const Program &p);
};

// Run the vertices of a compute set (one superstep: compute, then sync).
class Execute : public Program {
public:
  explicit Execute(ComputeSet cs, const DebugContext &debugContext = {});
};

// Copy between tensors (exchange or on-tile copies), or between a stream and a tensor.
class Copy : public Program {
public:
  Copy(const Tensor &src, const Tensor &dst, bool dontOutline = false, const DebugContext &debugContext = {});
  Copy(const DataStream &stream, const Tensor &dst, bool optimiseMemory = false,
       const DebugContext &debugContext = {});
  Copy(const Tensor &src, const DataStream &stream, bool optimiseMemory = false,
       const DebugContext &debugContext = {});
};

// Wait until every tile (of the kind the SyncType says) reaches this point.
class Sync : public Program {
public:
  explicit Sync(SyncType type, const DebugContext &debugContext = {});
};

}  // namespace program
}  // namespace poplar

#endif

// Stand-in for <poplar/Engine.hpp> (Graphcore Poplar SDK), for syntax checking
// host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_ENGINE_HPP
#define TILEPLAN_STANDIN_POPLAR_ENGINE_HPP

#include <string>

#include <poplar/Device.hpp>
#include <poplar/Graph.hpp>
#include <poplar/Program.hpp>
#include <poplar/StandIn.hpp>

namespace poplar {

// Compiles a graph and its programs, loads them onto a device and runs them.
class Engine {
public:
  Engine(const Graph &graph, ArrayRef<program::Program> progs, const OptionFlags &options = {});
  Engine(const Graph &graph, const program::Program &prog, const OptionFlags &options = {});
  void load(const Device &device);
  void run(unsigned prog = 0, const std::string &debugName = "");
  void connectStream(StringRef handle, void *p);
  void connectStream(StringRef handle, void *begin, void *end);
};

}  // namespace poplar

#endif

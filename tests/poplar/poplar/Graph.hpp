// Stand-in for <poplar/Graph.hpp> (Graphcore Poplar SDK), for syntax checking
// host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_GRAPH_HPP
#define TILEPLAN_STANDIN_POPLAR_GRAPH_HPP

#include <cstddef>
#include <type_traits>

#include <poplar/DataStream.hpp>
#include <poplar/Device.hpp>
#include <poplar/GraphElements.hpp>
#include <poplar/StandIn.hpp>
#include <poplar/Target.hpp>
#include <poplar/Tensor.hpp>
#include <poplar/Type.hpp>

namespace poplar {

enum class CodeletFileType { PreprocessedAsmSource, AsmSource, PreprocessedCSource, CSource,
                             PreprocessedCppSource, CppSource, IrSource, Object, Auto };

class replication_factor {
public:
  explicit replication_factor(unsigned r);
};

class Graph {
public:
  Graph(const Target &target, replication_factor r = replication_factor(1));
  Graph(const Device &device, replication_factor r = replication_factor(1));

  const Target &getTarget() const;

  // Codelets: C++ vertex sources compiled for the graph's target.
  bool addCodelets(StringRef src, CodeletFileType type = CodeletFileType::Auto, StringRef compileFlags = "",
                   StringRef targetName = "");

  // Variables and where their elements live.
  Tensor addVariable(const Type &type, ArrayRef<std::size_t> shape, const DebugContext &debugContext = {});
  void setTileMapping(const Tensor &t, unsigned tileNum);
  void setTileMapping(VertexRef v, unsigned tileNum);

  // Compute sets and vertices.
  ComputeSet addComputeSet(const DebugContext &debugContext = {});
  VertexRef addVertex(ComputeSet cs, StringRef vertexType);
  void connect(FieldRef field, const Tensor &tensor);
  template <typename T>
  void setInitialValue(const FieldRef &field, T val,
                       typename std::enable_if<std::is_arithmetic<T>::value>::type * = nullptr);

  // Host streams.
  DataStream addHostToDeviceFIFO(StringRef handle, const Type &elementType, std::size_t numElements,
                                 ReplicatedStreamMode replicatedMode = ReplicatedStreamMode::REPLICATE,
                                 const OptionFlags &options = {});
  DataStream addDeviceToHostFIFO(StringRef handle, const Type &elementType, std::size_t numElements,
                                 const OptionFlags &options = {});
};

}  // namespace poplar

#endif

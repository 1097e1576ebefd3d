// Stand-in for <poplar/DataStream.hpp> (Graphcore Poplar SDK), for syntax
// checking host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_DATASTREAM_HPP
#define TILEPLAN_STANDIN_POPLAR_DATASTREAM_HPP

#include <cstddef>
#include <string>

#include <poplar/Type.hpp>

namespace poplar {

enum class ReplicatedStreamMode { REPLICATE, BROADCAST };

// A unidirectional host <-> device stream.
class DataStream {
public:
  DataStream();
  DataStream(const DataStream &);
  DataStream &operator=(const DataStream &);
  std::string handle() const;
  std::size_t numElements() const;
  Type elementType() const;
};

}  // namespace poplar

#endif

// Stand-in for <poplar/IPUModel.hpp> (Graphcore Poplar SDK), for syntax
// checking host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_IPUMODEL_HPP
#define TILEPLAN_STANDIN_POPLAR_IPUMODEL_HPP

#include <limits>
#include <string>

#include <poplar/Device.hpp>
#include <poplar/StandIn.hpp>

namespace poplar {

// A model of an IPU, run on the host CPU.
struct IPUModel {
  explicit IPUModel(const char *IPUVersion = "ipu2");
  Device createDevice(OptionFlags opts = {}, bool accurateHalf = false,
                      unsigned deviceManagerId = std::numeric_limits<unsigned>::max()) const;
  std::string IPUVersion;
  unsigned numIPUs;
  unsigned tilesPerIPU;
  unsigned numWorkerContexts;
  unsigned memoryBytesPerTile;
};

}  // namespace poplar

#endif

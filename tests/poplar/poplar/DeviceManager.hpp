// Stand-in for <poplar/DeviceManager.hpp> (Graphcore Poplar SDK), for syntax
// checking host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_DEVICEMANAGER_HPP
#define TILEPLAN_STANDIN_POPLAR_DEVICEMANAGER_HPP

#include <cstddef>
#include <vector>

#include <poplar/Device.hpp>
#include <poplar/StandIn.hpp>
#include <poplar/Target.hpp>

namespace poplar {

class DeviceManager {
public:
  DeviceManager();
  static DeviceManager createDeviceManager();
  std::size_t getNumDevices() const;
  std::vector<Device> getDevices(TargetType type, unsigned requiredNumIPUs,
                                 const OptionFlags &opts = {}) const;
  Device getDevice(unsigned deviceManagerId, const OptionFlags &opts = {}) const;
};

}  // namespace poplar

#endif

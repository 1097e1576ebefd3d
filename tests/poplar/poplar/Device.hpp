// Stand-in for <poplar/Device.hpp> (Graphcore Poplar SDK), for syntax checking
// host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_DEVICE_HPP
#define TILEPLAN_STANDIN_POPLAR_DEVICE_HPP

#include <poplar/Target.hpp>

namespace poplar {

// A physical or modelled device; movable, not copyable.
class Device {
public:
  Device();
  Device(Device &&) noexcept;
  virtual ~Device();
  Device &operator=(Device &&) noexcept;
  Device(const Device &) = delete;
  Device &operator=(const Device &) = delete;
  unsigned getId() const;
  const Target &getTarget() const;
  bool attach() const;
  bool isAttached() const;
  void detach() const;
};

}  // namespace poplar

#endif

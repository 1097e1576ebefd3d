// Stand-in for part of the Graphcore Poplar SDK host API, for syntax checking
// only: `g++ -std=c++17 -fsyntax-only -I tests/poplar host.cpp` checks that a
// host program tileplan emits uses real Poplar names and signatures. These
// headers declare just the surface host.cpp uses (as documented in the Poplar
// API reference); they are not an implementation and nothing here links.
//
// This file holds the small value types the real SDK spreads over
// ArrayRef.hpp, StringRef.hpp, DebugContext.hpp and OptionFlags.hpp.
#ifndef TILEPLAN_STANDIN_POPLAR_STANDIN_HPP
#define TILEPLAN_STANDIN_POPLAR_STANDIN_HPP

#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace poplar {

// A non-owning view of a contiguous sequence (poplar/ArrayRef.hpp).
template <class T> class ArrayRef {
public:
  ArrayRef();
  ArrayRef(const T *p, std::size_t size);
  ArrayRef(const std::vector<T> &v);
  ArrayRef(std::initializer_list<T> list);
  template <std::size_t N> ArrayRef(const T (&array)[N]);
  const T *begin() const;
  const T *end() const;
  std::size_t size() const;
  const T &operator[](std::size_t i) const;
};

// A non-owning string view (poplar/StringRef.hpp).
class StringRef {
public:
  StringRef();
  StringRef(const char *s);
  StringRef(const std::string &s);
  operator std::string() const;
};

// Names a graph element for debugging and profiles (poplar/DebugContext.hpp).
class DebugContext {
public:
  DebugContext(const char *name = "");
  DebugContext(const std::string &name);
  DebugContext(StringRef name);
};

// Engine, device and stream options (poplar/OptionFlags.hpp).
class OptionFlags {
public:
  using initializer_list = std::initializer_list<std::pair<const std::string, std::string>>;
  OptionFlags();
  OptionFlags(initializer_list list);
  void set(StringRef option, StringRef value);
};

}  // namespace poplar

#endif

// Stand-in for <poplar/Vertex.hpp> (Graphcore Poplar SDK): the small part of the
// vertex API that tileplan's codelets use, so tests can compile and run them on
// the host. Names follow Poplar: poplar::Vertex, poplar::MultiVertex (with
// numWorkers()), poplar::Input<T>, poplar::Output<T>, poplar::InOut<T>,
// poplar::Vector<T, VectorLayout, alignment> and poplar::VectorLayout.
//
// Not Poplar: `bind(pointer, size)` on vector fields, which stands in for the
// host-side graph.connect() of a real program (the test harness calls it).
#ifndef TILEPLAN_STANDIN_POPLAR_VERTEX_HPP
#define TILEPLAN_STANDIN_POPLAR_VERTEX_HPP

#include <cassert>
#include <cstddef>

namespace poplar {

enum class VectorLayout { ONE_PTR, SPAN, SCALED_PTR32, SCALED_PTR64, COMPACT_PTR };

// The element sequence a field refers to; `T` is const for inputs.
template <typename T, VectorLayout L = VectorLayout::SPAN, unsigned Align = alignof(T),
          bool Interleaved = false>
class Vector {
public:
  using value_type = T;
  void bind(T *data, std::size_t size) { data_ = data; size_ = size; }
  std::size_t size() const { return size_; }
  T &operator[](std::size_t i) const { assert(i < size_); return data_[i]; }
  T *data() const { return data_; }
  T *begin() const { return data_; }
  T *end() const { return data_ + size_; }

private:
  T *data_ = nullptr;
  std::size_t size_ = 0;
};

// A scalar field: Input<float> x; reads `*x` or converts implicitly.
template <typename T> class Input {
public:
  void bind(const T *p) { p_ = p; }
  const T &operator*() const { return *p_; }
  operator const T &() const { return *p_; }
private:
  const T *p_ = nullptr;
};

template <typename T, VectorLayout L, unsigned A, bool I>
class Input<Vector<T, L, A, I>> : public Vector<const T, L, A, I> {};

template <typename T> class Output {
public:
  void bind(T *p) { p_ = p; }
  T &operator*() const { return *p_; }
private:
  T *p_ = nullptr;
};

template <typename T, VectorLayout L, unsigned A, bool I>
class Output<Vector<T, L, A, I>> : public Vector<T, L, A, I> {};

template <typename T> class InOut : public Output<T> {};

template <typename T, VectorLayout L, unsigned A, bool I>
class InOut<Vector<T, L, A, I>> : public Vector<T, L, A, I> {};

// A vertex run by one worker: bool compute().
class Vertex {};

// A vertex run by every worker context of a tile: bool compute(unsigned workerId).
class MultiVertex {
public:
  static unsigned numWorkers() { return 6; }
};

}  // namespace poplar

#endif

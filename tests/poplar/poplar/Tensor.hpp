// Stand-in for <poplar/Tensor.hpp> (Graphcore Poplar SDK), for syntax checking
// host programs only; see StandIn.hpp. Not an implementation.
#ifndef TILEPLAN_STANDIN_POPLAR_TENSOR_HPP
#define TILEPLAN_STANDIN_POPLAR_TENSOR_HPP

#include <cstddef>
#include <vector>

#include <poplar/StandIn.hpp>
#include <poplar/Type.hpp>

namespace poplar {

// A reference to a subset of the elements of graph variables.
class Tensor {
public:
  Tensor();
  Type elementType() const;
  std::size_t numElements() const;
  std::size_t rank() const;
  std::vector<std::size_t> shape() const;
  Tensor slice(std::size_t begin, std::size_t end) const;
  Tensor slice(std::size_t begin, std::size_t end, unsigned dimension) const;
  Tensor flatten() const;
  Tensor reshape(ArrayRef<std::size_t> shape) const;
  Tensor reinterpret(const Type &type) const;
  Tensor operator[](std::size_t i) const;
};

// Concatenate tensors along a dimension.
Tensor concat(ArrayRef<Tensor> ts, unsigned dimension = 0);
Tensor concat(const Tensor &first, const Tensor &second, unsigned dimension = 0);

}  // namespace poplar

#endif

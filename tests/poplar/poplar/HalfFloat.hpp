// Stand-in for <poplar/HalfFloat.hpp> (Graphcore Poplar SDK), for compiling
// tileplan's codelets on a host without the SDK. On the IPU `half` is a native
// IEEE binary16 type; here it is the compiler's _Float16 (GCC >= 12 on x86-64),
// whose conversions from float round to nearest even, as the IPU's do.
#ifndef TILEPLAN_STANDIN_POPLAR_HALFFLOAT_HPP
#define TILEPLAN_STANDIN_POPLAR_HALFFLOAT_HPP

using half = _Float16;

static_assert(sizeof(half) == 2, "half must be IEEE binary16");

#endif

// <immintrin.h> for the x86 host paths (AVX2, AVX-512 by target attribute,
// F16C), included once here: gcc 12's AVX-512 headers trip
// -Wmaybe-uninitialized on their own _mm512_undefined_* placeholders when
// inlined (gcc bug 105593), silenced for the header's lines only (diagnostic
// state is by source location).
#pragma once

#if !defined(__CUDA_ARCH__) && (defined(__AVX2__) || defined(__F16C__))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

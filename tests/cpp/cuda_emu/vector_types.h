// CUDA's vector types for the CPU emulation (cuda_runtime.h includes this),
// with CUDA's sizes and alignments (vector_types.h of the toolkit), so that a
// 16-byte access through a float4* or uint4* needs a 16-byte-aligned address
// here as on a GPU. The emulated targets are compiled with
// -fsanitize=alignment -fno-sanitize-recover=alignment (CMakeLists.txt): a
// load or store through a misaligned float4* stops the program with
// "misaligned address", where a GPU stops the kernel.
#pragma once

#define DQ_EMU_VEC2(name, T, align)                                   \
  struct alignas(align) name {                                        \
    T x, y;                                                           \
  };                                                                  \
  inline name make_##name(T x, T y) { return name{x, y}; }
#define DQ_EMU_VEC3(name, T)                                          \
  struct name {                                                       \
    T x, y, z;                                                        \
  };                                                                  \
  inline name make_##name(T x, T y, T z) { return name{x, y, z}; }
#define DQ_EMU_VEC4(name, T, align)                                   \
  struct alignas(align) name {                                        \
    T x, y, z, w;                                                     \
  };                                                                  \
  inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }

DQ_EMU_VEC2(char2, signed char, 2)
DQ_EMU_VEC4(char4, signed char, 4)
DQ_EMU_VEC2(uchar2, unsigned char, 2)
DQ_EMU_VEC4(uchar4, unsigned char, 4)
DQ_EMU_VEC2(short2, short, 4)
DQ_EMU_VEC4(short4, short, 8)
DQ_EMU_VEC2(ushort2, unsigned short, 4)
DQ_EMU_VEC4(ushort4, unsigned short, 8)
DQ_EMU_VEC2(int2, int, 8)
DQ_EMU_VEC3(int3, int)
DQ_EMU_VEC4(int4, int, 16)
DQ_EMU_VEC2(uint2, unsigned, 8)
DQ_EMU_VEC3(uint3, unsigned)
DQ_EMU_VEC4(uint4, unsigned, 16)
DQ_EMU_VEC2(longlong2, long long, 16)
DQ_EMU_VEC2(ulonglong2, unsigned long long, 16)
DQ_EMU_VEC2(float2, float, 8)
DQ_EMU_VEC3(float3, float)
DQ_EMU_VEC4(float4, float, 16)
DQ_EMU_VEC2(double2, double, 16)

#undef DQ_EMU_VEC2
#undef DQ_EMU_VEC3
#undef DQ_EMU_VEC4

static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "CUDA's float4");
static_assert(sizeof(uint2) == 8 && alignof(uint2) == 8, "CUDA's uint2");
static_assert(sizeof(ushort4) == 8 && alignof(ushort4) == 8, "CUDA's ushort4");
static_assert(sizeof(uchar4) == 4 && alignof(uchar4) == 4, "CUDA's uchar4");
static_assert(sizeof(uint3) == 12 && alignof(uint3) == 4, "CUDA's uint3");

// The CPU stand-in for the CUDA runtime declared in cuda_runtime.h (see there
// for what it models). One launch at a time (a lock serialises host threads),
// the threads of a block as fibers on the launching thread.
#include "cuda_runtime.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define DQ_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DQ_EMU_ASAN 1
#endif
#endif
#ifdef DQ_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

// Bounds of the section holding every static __shared__ variable (GNU ld
// defines them for a section whose name is an identifier).
extern "C" unsigned char __start_dq_emu_shared[], __stop_dq_emu_shared[];
// An anchor so that the section exists even in a program without shared variables.
__attribute__((section("dq_emu_shared"), used)) static unsigned char dq_emu_shared_anchor[16];

namespace dynamiq_cuda_emu {
namespace {

constexpr unsigned char kFill = 0xA5;       // fresh device and shared memory
constexpr size_t kAlign = 256;              // cudaMalloc's alignment
constexpr size_t kStackBytes = 256 << 10;   // per emulated thread
constexpr size_t kMaxDynamicSmem = 48 << 10;

size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

thread_local cudaError_t g_last = cudaSuccess;  // per host thread, cleared by cudaGetLastError
cudaError_t g_sticky = cudaSuccess;              // a failed launch: reported by every sync

std::recursive_mutex& mutex() {
  static std::recursive_mutex m;
  return m;
}

// ---- device memory ----------------------------------------------------------------

struct Alloc {
  size_t bytes;       // as requested
  void* map;          // the whole mapping (data pages + guard page)
  size_t map_bytes;
};
std::map<uintptr_t, Alloc>& allocs() {
  static std::map<uintptr_t, Alloc> m;
  return m;
}

// The live allocation holding [p, p + n), or nullptr.
const std::pair<const uintptr_t, Alloc>* find_alloc(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto& m = allocs();
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  const size_t off = a - it->first, size = it->second.bytes;
  if (off > size || n > size - off) return nullptr;
  return &*it;
}

bool is_device(const void* p) { return find_alloc(p, 0) != nullptr; }

size_t slack_of(const Alloc& al, uintptr_t base) {
  const uintptr_t guard = reinterpret_cast<uintptr_t>(al.map) + al.map_bytes - page_size();
  return size_t(guard - base) - al.bytes;
}

cudaError_t fail(cudaError_t e, const char* what) {
  std::fprintf(stderr, "[cuda-emu] %s\n", what);
  g_last = e;
  return e;
}

// ---- fibers -----------------------------------------------------------------------

// A switch between fibers. glibc's swapcontext saves and restores the signal mask, one system
// call per switch: 4.3 million rt_sigprocmask calls in CudaDynamiq.KernelsBitIdenticalToCpu alone,
// 42 of the suite's 89 CPU s in the kernel (2-core AMD guest, 2026-11-28). On x86-64 a switch is
// what the System V ABI has a callee keep (rbx, rbp, r12-r15, the x87 and SSE control words) and the
// stack pointer, pushed on the old stack and popped from the new one; elsewhere ucontext. Under
// ASan each switch tells the sanitizer which stack it moves to (its fiber API), as its interceptor
// of swapcontext did. Not with shadow stacks compiled in (-fcf-protection: __CET__ bit 2), which
// a return to a popped address would break: glibc's swapcontext keeps them right.
#if defined(__x86_64__) && !(defined(__CET__) && (__CET__ & 2))
#define DQ_EMU_FAST_SWITCH 1
struct Context {
  void* sp = nullptr;  // where the switch that left this context pushed its registers
};
extern "C" void dq_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl dq_emu_switch
  .hidden dq_emu_switch
  .type dq_emu_switch, @function
dq_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  fnstcw (%rsp)
  stmxcsr 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dq_emu_switch, .-dq_emu_switch
)");
#else
struct Context {
  ucontext_t uc;
};
#endif

enum class Wait : uint8_t { none, barrier, warp };

struct Fiber {
  Context ctx;
  void* fake_stack = nullptr;  // ASan's, while the fiber is switched out
  bool done = false;
  Wait wait = Wait::none;
  // at a warp operation (or a barrier: value is the predicate)
  WarpOp op = WarpOp::sync;
  unsigned mask = 0;
  int arg = 0, width = 32;
  uint64_t value = 0, result = 0;
};

// Lanes of one warp waiting at the same operation (same kind, same mask).
struct Pending {
  WarpOp op;
  unsigned mask;
  unsigned arrived;
};

constexpr unsigned kMaxWarps = 1024 / 32;

struct Block {
  Context sched;
  const void* sched_stack = nullptr;  // the scheduler's stack (ASan: learnt at the first switch)
  size_t sched_stack_bytes = 0;
  void* sched_fake_stack = nullptr;
  std::vector<Fiber> fibers;
  std::vector<char*> stacks;  // kept across launches
  unsigned current = 0;
  unsigned threads = 0;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  size_t smem_bytes = 0;  // dynamic shared memory of the current launch
  bool failed = false;    // a thread broke a rule (stderr says which); the block is abandoned
  std::vector<Pending> pending[kMaxWarps];
  unsigned exited[kMaxWarps] = {};  // lanes that returned, per warp
};
Block& block() {
  static Block b;
  return b;
}

bool& reverse_order() {
  static bool r = [] {
    const char* e = std::getenv("DYNAMIQ_CUDA_EMU_ORDER");
    return e && std::strcmp(e, "reverse") == 0;
  }();
  return r;
}

// kMaxDynamicSmem bytes followed by an inaccessible page, made once.
unsigned char* smem_area_end() {
  static unsigned char* end = [] {
    void* m = mmap(nullptr, kMaxDynamicSmem + page_size(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::perror("[cuda-emu] mmap shared memory");
      std::abort();
    }
    unsigned char* e = static_cast<unsigned char*>(m) + kMaxDynamicSmem;
    mprotect(e, page_size(), PROT_NONE);
    return e;
  }();
  return end;
}

void set_thread_index(unsigned t) {
  threadIdx = uint3{t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
}

// ASan's fiber API around a switch (nothing without ASan).
inline void asan_leaving(void** fake_stack, const void* to_stack, size_t to_bytes) {
#ifdef DQ_EMU_ASAN
  __sanitizer_start_switch_fiber(fake_stack, to_stack, to_bytes);
#else
  (void)fake_stack, (void)to_stack, (void)to_bytes;
#endif
}
inline void asan_arrived(void* fake_stack, const void** from_stack, size_t* from_bytes) {
#ifdef DQ_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, from_stack, from_bytes);
#else
  (void)fake_stack, (void)from_stack, (void)from_bytes;
#endif
}

inline void raw_switch(Context& from, Context& to) {
#ifdef DQ_EMU_FAST_SWITCH
  dq_emu_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

// From the scheduler into fiber t, until it waits, returns or fails.
void enter(unsigned t);
// From the running fiber back to the scheduler; `for_good`: it is never resumed.
void leave(bool for_good) {
  Block& b = block();
  Fiber& f = b.fibers[b.current];
  asan_leaving(for_good ? nullptr : &f.fake_stack, b.sched_stack, b.sched_stack_bytes);
  raw_switch(f.ctx, b.sched);
  asan_arrived(f.fake_stack, &b.sched_stack, &b.sched_stack_bytes);
}

void trampoline() {
  Block& b = block();
  asan_arrived(nullptr, &b.sched_stack, &b.sched_stack_bytes);  // the first switch into this fiber
  b.body(b.arg);
  b.fibers[b.current].done = true;
  b.exited[b.current / 32] |= 1u << (b.current % 32);
  leave(true);
  std::abort();  // never resumed
}

char* stack_for(unsigned t) {
  Block& b = block();
  while (b.stacks.size() <= t) {
    // a guard page below each stack catches an overflow
    void* m = mmap(nullptr, kStackBytes + page_size(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) {
      std::perror("[cuda-emu] mmap stack");
      std::abort();
    }
    mprotect(m, page_size(), PROT_NONE);
    b.stacks.push_back(static_cast<char*>(m) + page_size());
  }
  return b.stacks[t];
}

// Makes fiber t start at trampoline() on its own stack at its first switch.
void start_fiber(unsigned t) {
  Fiber& f = block().fibers[t];
  char* stack = stack_for(t);
#ifdef DQ_EMU_ASAN
  // the frames left on a reused stack (a fiber ends inside leave(), an abandoned one anywhere)
  // keep their redzones poisoned: cleared, as ASan's swapcontext interceptor did on every switch
  __asan_unpoison_memory_region(stack, kStackBytes);
#endif
#ifdef DQ_EMU_FAST_SWITCH
  // What dq_emu_switch pops, from the lowest address: the x87 control word and MXCSR (this
  // thread's), r15 r14 r13 r12 rbx rbp, then the address it returns to, trampoline(), whose own
  // return address (0: it never returns) lies at the 16-aligned top as a call would leave it.
  uint16_t fpu_cw;
  uint32_t mxcsr;
  asm volatile("fnstcw %0\n\tstmxcsr %1" : "=m"(fpu_cw), "=m"(mxcsr));
  uint64_t frame[10] = {fpu_cw, mxcsr, 0, 0, 0, 0, 0, 0, reinterpret_cast<uint64_t>(&trampoline), 0};
  char* top = stack + kStackBytes;  // (kStackBytes and the page-aligned stack: top is 16-aligned)
  std::memcpy(top - sizeof frame, frame, sizeof frame);
  f.ctx.sp = top - sizeof frame;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = stack;
  f.ctx.uc.uc_stack.ss_size = kStackBytes;
  f.ctx.uc.uc_link = nullptr;  // trampoline() never returns
  makecontext(&f.ctx.uc, trampoline, 0);
#endif
}

void enter(unsigned t) {
  Block& b = block();
  asan_leaving(&b.sched_fake_stack, stack_for(t), kStackBytes);
  raw_switch(b.sched, b.fibers[t].ctx);
  asan_arrived(b.sched_fake_stack, nullptr, nullptr);
}

}  // namespace

std::unique_lock<std::recursive_mutex> lock() { return std::unique_lock<std::recursive_mutex>(mutex()); }

bool check_launch(dim3 grid, dim3 block_dim, size_t smem) {
  const uint64_t threads = uint64_t(block_dim.x) * block_dim.y * block_dim.z;
  const bool bad = threads == 0 || threads > 1024 || block_dim.z > 64 || grid.x == 0 || grid.y == 0 ||
                   grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
                   smem > kMaxDynamicSmem;
  if (bad) {
    std::fprintf(stderr, "[cuda-emu] invalid launch: grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of shared memory\n",
                 grid.x, grid.y, grid.z, block_dim.x, block_dim.y, block_dim.z, smem);
    g_last = cudaErrorInvalidConfiguration;
    return false;
  }
  return true;
}

void run_grid(dim3 grid, dim3 block_dim, size_t smem, void (*body)(void*), void* ctx) {
  const auto held = lock();
  gridDim = grid;
  blockDim = block_dim;
  block().smem_bytes = (smem + 15) / 16 * 16;
  bool ok = true;
  // Blocks one after another, in linear index order or, with the threads, in reverse: a GPU
  // gives blocks no order, so a kernel whose block reads what a later block writes (or the
  // other way round) fails in one of the two orders.
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  const bool rev = reverse_order();
  for (uint64_t k = 0; k < blocks && ok; ++k) {
    const uint64_t l = rev ? blocks - 1 - k : k;
    blockIdx = uint3{unsigned(l % grid.x), unsigned(l / grid.x % grid.y), unsigned(l / (uint64_t(grid.x) * grid.y))};
    ok = run_block(block_dim.x * block_dim.y * block_dim.z, body, ctx);
  }
  if (!ok) {
    g_last = cudaErrorLaunchFailure;
    g_sticky = cudaErrorLaunchFailure;
  }
}

unsigned char* dynamic_smem() { return smem_area_end() - block().smem_bytes; }

bool set_reverse_order(bool reverse) {
  const bool old = reverse_order();
  reverse_order() = reverse;
  return old;
}

void reset_errors() {
  const auto held = lock();
  g_last = cudaSuccess;
  g_sticky = cudaSuccess;
}

namespace {

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::sync: return "__syncwarp";
    case WarpOp::shfl_idx: return "__shfl_sync";
    case WarpOp::shfl_up: return "__shfl_up_sync";
    case WarpOp::shfl_down: return "__shfl_down_sync";
    case WarpOp::shfl_bfly: return "__shfl_xor_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::any: return "__any_sync";
    case WarpOp::all: return "__all_sync";
    case WarpOp::match_any: return "__match_any_sync";
    case WarpOp::match_all: return "__match_all_sync";
    case WarpOp::reduce_add: return "__reduce_add_sync";
    case WarpOp::reduce_min_u:
    case WarpOp::reduce_min_s: return "__reduce_min_sync";
    case WarpOp::reduce_max_u:
    case WarpOp::reduce_max_s: return "__reduce_max_sync";
    case WarpOp::reduce_and: return "__reduce_and_sync";
    case WarpOp::reduce_or: return "__reduce_or_sync";
    case WarpOp::reduce_xor: return "__reduce_xor_sync";
  }
  return "?";
}

// The lanes of warp w that exist in a block of `threads` threads.
unsigned existing_lanes(unsigned w, unsigned threads) {
  const unsigned n = threads - w * 32;
  return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

// Reports a rule the calling thread broke, abandons the block (the launch fails).
[[noreturn]] void thread_fails(WarpOp op, const char* what, unsigned mask, unsigned lanes) {
  Block& b = block();
  const unsigned t = b.current;
  std::fprintf(stderr, "[cuda-emu] block (%u, %u, %u) thread %u (warp %u, lane %u): %s(mask 0x%08x): ", blockIdx.x,
               blockIdx.y, blockIdx.z, t, t / 32, t % 32, op_name(op), mask);
  std::fprintf(stderr, what, lanes);
  std::fputc('\n', stderr);
  b.failed = true;
  leave(true);
  std::abort();  // never resumed
}

constexpr uint64_t kPoison = 0xA5A5A5A5A5A5A5A5ull;  // a shuffle's read of a lane outside the mask

// Gives every lane of the complete group g of warp w its result (PTX's semantics).
void release(unsigned w, const Pending& g) {
  Block& b = block();
  Fiber* lanes = &b.fibers[w * 32];
  const unsigned m = g.mask;
  uint64_t common = 0;  // the votes' and reductions' one result
  switch (g.op) {
    case WarpOp::ballot:
    case WarpOp::any:
    case WarpOp::all: {
      unsigned yes = 0;
      for (unsigned l = 0; l < 32; ++l)
        if ((m >> l & 1u) && lanes[l].value) yes |= 1u << l;
      common = g.op == WarpOp::ballot ? yes : g.op == WarpOp::any ? yes != 0 : yes == m;
      break;
    }
    case WarpOp::reduce_add:
    case WarpOp::reduce_min_u:
    case WarpOp::reduce_max_u:
    case WarpOp::reduce_min_s:
    case WarpOp::reduce_max_s:
    case WarpOp::reduce_and:
    case WarpOp::reduce_or:
    case WarpOp::reduce_xor: {
      bool first = true;
      uint32_t r = 0;
      for (unsigned l = 0; l < 32; ++l) {
        if (!(m >> l & 1u)) continue;
        const uint32_t v = uint32_t(lanes[l].value);
        if (first) {
          r = v;
          first = false;
          continue;
        }
        switch (g.op) {
          case WarpOp::reduce_add: r += v; break;
          case WarpOp::reduce_min_u: r = v < r ? v : r; break;
          case WarpOp::reduce_max_u: r = v > r ? v : r; break;
          case WarpOp::reduce_min_s: r = int32_t(v) < int32_t(r) ? v : r; break;
          case WarpOp::reduce_max_s: r = int32_t(v) > int32_t(r) ? v : r; break;
          case WarpOp::reduce_and: r &= v; break;
          case WarpOp::reduce_or: r |= v; break;
          default: r ^= v; break;
        }
      }
      common = r;
      break;
    }
    case WarpOp::match_all: {
      bool same = true;
      const uint64_t v0 = lanes[__builtin_ctz(m)].value;
      for (unsigned l = 0; l < 32; ++l)
        if ((m >> l & 1u) && lanes[l].value != v0) same = false;
      common = same ? m : 0;
      break;
    }
    default: break;
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (!(m >> l & 1u)) continue;
    Fiber& f = lanes[l];
    uint64_t r = common;
    switch (g.op) {
      case WarpOp::shfl_idx:
      case WarpOp::shfl_up:
      case WarpOp::shfl_down:
      case WarpOp::shfl_bfly: {
        // CUDA's c operand: segment mask (32 - width) << 8, clamp 31 (0 for up)
        const int seg = (32 - f.width) & 31, b5 = f.arg & 31, lane = int(l);
        const int first = lane & seg, last = first | (31 & ~seg);
        int j = lane;
        bool in = true;
        switch (g.op) {
          case WarpOp::shfl_idx: j = first | (b5 & ~seg); in = j <= last; break;
          case WarpOp::shfl_up: j = lane - b5; in = j >= first; break;
          case WarpOp::shfl_down: j = lane + b5; in = j <= last; break;
          default: j = lane ^ b5; in = j <= last; break;
        }
        if (!in) j = lane;
        r = (m >> j & 1u) ? lanes[j].value : kPoison;
        break;
      }
      case WarpOp::match_any: {
        unsigned same = 0;
        for (unsigned k = 0; k < 32; ++k)
          if ((m >> k & 1u) && lanes[k].value == f.value) same |= 1u << k;
        r = same;
        break;
      }
      default: break;
    }
    f.result = r;
    f.wait = Wait::none;
  }
}

// Why nothing in the block can go on: reports the first stuck warp operation.
void report_deadlock(unsigned threads) {
  Block& b = block();
  for (unsigned w = 0; w * 32 < threads; ++w)
    for (const Pending& g : b.pending[w]) {
      const unsigned missing = g.mask & ~g.arrived;
      const unsigned l = unsigned(__builtin_ctz(missing));
      const Fiber& f = b.fibers[w * 32 + l];
      char why[128];
      if (f.done)
        std::snprintf(why, sizeof why, "it has exited");
      else if (f.wait == Wait::barrier)
        std::snprintf(why, sizeof why, "it waits at __syncthreads()");
      else
        std::snprintf(why, sizeof why, "it waits at %s(mask 0x%08x)", op_name(f.op), f.mask);
      std::fprintf(stderr,
                   "[cuda-emu] block (%u, %u, %u) warp %u: lanes 0x%08x wait at %s(mask 0x%08x) that lane %u never "
                   "reaches (%s)\n",
                   blockIdx.x, blockIdx.y, blockIdx.z, w, g.arrived, op_name(g.op), g.mask, l, why);
      return;
    }
  unsigned done = 0, waiting = 0;
  for (const Fiber& f : b.fibers) {
    done += f.done ? 1u : 0u;
    waiting += f.wait == Wait::barrier ? 1u : 0u;
  }
  std::fprintf(stderr,
               "[cuda-emu] block (%u, %u, %u): %u thread(s) wait at __syncthreads() that %u returned "
               "thread(s) never reach\n",
               blockIdx.x, blockIdx.y, blockIdx.z, waiting, done);
}

}  // namespace

// A fiber runs until it returns or waits: at a barrier or at a warp
// operation. A warp operation is released by the last lane of its mask to
// arrive (which goes on without a switch); a barrier once every thread of the
// block waits at it. When no fiber can run and not all have returned, the
// launch fails (a GPU would hang or compute garbage).
bool run_block(unsigned threads, void (*body)(void*), void* arg) {
  Block& b = block();
  b.body = body;
  b.arg = arg;
  b.threads = threads;
  b.failed = false;
  b.fibers.assign(threads, Fiber());
  for (unsigned w = 0; w < kMaxWarps; ++w) {
    b.pending[w].clear();
    b.exited[w] = 0;
  }
  std::memset(dynamic_smem(), kFill, b.smem_bytes);
  std::memset(__start_dq_emu_shared, kFill, size_t(__stop_dq_emu_shared - __start_dq_emu_shared));
  for (unsigned t = 0; t < threads; ++t) start_fiber(t);
  const bool rev = reverse_order();
  for (;;) {
    bool ran = false;
    for (unsigned k = 0; k < threads; ++k) {
      const unsigned t = rev ? threads - 1 - k : k;
      Fiber& f = b.fibers[t];
      if (f.done || f.wait != Wait::none) continue;
      ran = true;
      b.current = t;
      set_thread_index(t);
      enter(t);
      if (b.failed) return false;  // the waiting fibers are abandoned (their stacks are reused)
    }
    if (ran) continue;  // lanes released by a later thread of this pass
    unsigned done = 0, at_barrier = 0;
    for (const Fiber& f : b.fibers) {
      done += f.done ? 1u : 0u;
      at_barrier += f.wait == Wait::barrier ? 1u : 0u;
    }
    if (done == threads) return true;
    if (at_barrier == threads) {
      uint64_t count = 0, all = 1, any = 0;
      for (const Fiber& f : b.fibers) {
        count += f.value;
        all &= f.value;
        any |= f.value;
      }
      for (Fiber& f : b.fibers) {
        f.result = f.op == WarpOp::all ? all : f.op == WarpOp::any ? any : count;
        f.wait = Wait::none;
      }
      continue;
    }
    report_deadlock(threads);
    return false;
  }
}

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  Block& b = block();
  const unsigned t = b.current, w = t / 32, lane = t % 32;
  Fiber& f = b.fibers[t];
  if (!(mask >> lane & 1u)) thread_fails(op, "the mask does not name the calling lane %u", mask, lane);
  const unsigned exist = existing_lanes(w, b.threads);
  if (mask & ~exist)
    thread_fails(op, "the mask names lanes the block does not have (this warp has lanes 0x%08x)", mask, exist);
  if (mask & b.exited[w]) thread_fails(op, "the mask names lanes that have exited (0x%08x)", mask, mask & b.exited[w]);
  if (width < 1 || width > 32 || (width & (width - 1)))
    thread_fails(op, "shuffle width %u is not a power of two in [1, 32]", mask, unsigned(width));
  f.op = op;
  f.mask = mask;
  f.value = value;
  f.arg = arg;
  f.width = width;
  std::vector<Pending>& pend = b.pending[w];
  size_t i = 0;
  while (i < pend.size() && !(pend[i].op == op && pend[i].mask == mask)) ++i;
  if (i == pend.size()) pend.push_back(Pending{op, mask, 0});
  pend[i].arrived |= 1u << lane;
  if (pend[i].arrived == mask) {
    const Pending g = pend[i];
    pend[i] = pend.back();
    pend.pop_back();
    release(w, g);  // this lane goes on at once
  } else {
    f.wait = Wait::warp;
    leave(false);
  }
  return f.result;
}

unsigned active_mask() {
  Block& b = block();
  const unsigned w = b.current / 32;
  return existing_lanes(w, b.threads) & ~b.exited[w];
}

}  // namespace dynamiq_cuda_emu

using namespace dynamiq_cuda_emu;

namespace {

uint64_t barrier(WarpOp kind, int predicate) {
  Block& b = block();
  Fiber& f = b.fibers[b.current];
  f.wait = Wait::barrier;
  f.op = kind;  // which of count / and / or the thread wants
  f.value = predicate != 0;
  leave(false);
  return f.result;
}

}  // namespace

void __syncthreads() { barrier(WarpOp::sync, 0); }
int __syncthreads_count(int predicate) { return int(barrier(WarpOp::sync, predicate)); }
int __syncthreads_and(int predicate) { return int(barrier(WarpOp::all, predicate)); }
int __syncthreads_or(int predicate) { return int(barrier(WarpOp::any, predicate)); }

namespace {

std::vector<ApiCall>* g_log = nullptr;  // set: logging (under the lock)
CopyCounts g_copies;  // device-to-host copies since the last reset_copy_counts
bool g_pools_supported = true;

// ---- streams, events, page-locked host memory ----------------------------------------

bool& async_flag() {
  static bool on = [] {
    const char* e = std::getenv("DYNAMIQ_CUDA_EMU_ASYNC");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

struct StreamQ {
  bool blocking = false;  // made with flags 0: ordered with the legacy default stream
  std::deque<std::function<void()>> work;
};
// Every stream made by cudaStreamCreateWithFlags, by handle (never the legacy nullptr).
std::map<cudaStream_t, StreamQ>& queues() {
  static auto* m = new std::map<cudaStream_t, StreamQ>();
  return *m;
}

// Runs `s`'s queued work, in order, until `until` says stop (or it is empty).
// Work may itself run other streams (a wait for an event).
template <class Until>
void run_queue(cudaStream_t s, Until until) {
  for (;;) {
    auto it = queues().find(s);
    if (it == queues().end() || it->second.work.empty() || until()) return;
    std::function<void()> w = std::move(it->second.work.front());
    it->second.work.pop_front();
    w();
  }
}
void drain(cudaStream_t s) {
  run_queue(s, [] { return false; });
}
void drain_all() {
  for (bool any = true; any;) {
    any = false;
    for (auto& kv : queues())
      if (!kv.second.work.empty()) {
        drain(kv.first);
        any = true;
        break;  // (the map may have changed)
      }
  }
}
// What the legacy default stream waits for: every blocking stream's work.
void drain_blocking() {
  for (bool any = true; any;) {
    any = false;
    for (auto& kv : queues())
      if (kv.second.blocking && !kv.second.work.empty()) {
        drain(kv.first);
        any = true;
        break;
      }
  }
}
bool queued(cudaStream_t s) { return async_flag() && s != nullptr && queues().count(s) != 0; }

}  // namespace

struct CUevent_st {
  struct State {
    bool done = true;  // never recorded: complete, as in CUDA
    bool queried = false;
    uint64_t generation = 0;
    cudaStream_t stream = nullptr;
    std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
  };
  std::shared_ptr<State> s = std::make_shared<State>();
};

namespace {

std::set<cudaEvent_t>& events() {
  static auto* m = new std::set<cudaEvent_t>();
  return *m;
}
bool live_event(cudaEvent_t e) { return e && events().count(e) != 0; }

// Runs the event's stream until the event has passed.
void run_to(const std::shared_ptr<CUevent_st::State>& st) {
  run_queue(st->stream, [&] { return st->done; });
  st->done = true;  // (its stream was destroyed or emptied: nothing left before it)
}

// Page-locked host allocations: start -> bytes.
std::map<uintptr_t, size_t>& pinned() {
  static auto* m = new std::map<uintptr_t, size_t>();
  return *m;
}
bool is_pinned(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = pinned().upper_bound(a);
  if (it == pinned().begin()) return false;
  --it;
  return a - it->first < it->second;
}

cudaError_t malloc_impl(void** ptr, size_t bytes) {
  const auto held = lock();
  if (!ptr) return fail(cudaErrorInvalidValue, "cudaMalloc: null result pointer");
  const size_t pg = page_size();
  const size_t data = ((bytes + kAlign - 1) / kAlign * kAlign + pg - 1) / pg * pg;
  const size_t map_bytes = (data == 0 ? pg : data) + pg;
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "cudaMalloc: out of memory");
  char* guard = static_cast<char*>(m) + map_bytes - pg;
  mprotect(guard, pg, PROT_NONE);
  // as close to the guard page as the 256-byte alignment allows
  const uintptr_t base = (reinterpret_cast<uintptr_t>(guard) - bytes) / kAlign * kAlign;
  std::memset(m, kFill, map_bytes - pg);
  allocs()[base] = Alloc{bytes, m, map_bytes};
  *ptr = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

cudaError_t free_impl(void* ptr) {
  const auto held = lock();
  if (!ptr) return cudaSuccess;
  auto& m = allocs();
  auto it = m.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.end()) return fail(cudaErrorInvalidDevicePointer, "cudaFree: not a live allocation");
  const Alloc al = it->second;
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(it->first) + al.bytes;
  const size_t slack = slack_of(al, it->first);
  for (size_t i = 0; i < slack; ++i)
    if (tail[i] != kFill) {
      std::fprintf(stderr, "[cuda-emu] cudaFree: %zu-byte allocation written past its end (byte %zu)\n",
                   al.bytes, i);
      g_sticky = cudaErrorLaunchFailure;
      break;
    }
  munmap(al.map, al.map_bytes);
  m.erase(it);
  return cudaSuccess;
}

// The checks of a copy (nullptr: fine, else what is wrong).
const char* copy_problem(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const bool dd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice;
  const bool sd = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost)
    return "cudaMemcpy: the emulator checks explicit directions only";
  if (dd ? !find_alloc(dst, bytes) : is_device(dst))
    return dd ? "cudaMemcpy: destination is not inside one device allocation"
              : "cudaMemcpy: host destination is device memory";
  if (sd ? !find_alloc(src, bytes) : is_device(src))
    return sd ? "cudaMemcpy: source is not inside one device allocation" : "cudaMemcpy: host source is device memory";
  return nullptr;
}

// A queued copy or memset whose device memory went away before it ran.
void use_after_free(const char* what) {
  std::fprintf(stderr, "[cuda-emu] %s ran on device memory freed after it was queued (use after free)\n", what);
  g_sticky = cudaErrorLaunchFailure;
}

cudaError_t memcpy_impl(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                        bool on_stream) {
  const auto held = lock();
  if (bytes == 0) return cudaSuccess;
  if (const char* why = copy_problem(dst, src, bytes, kind)) return fail(cudaErrorInvalidValue, why);
  if (kind == cudaMemcpyDeviceToHost) {
    ++g_copies.d2h_copies;
    g_copies.d2h_bytes += bytes;
  }
  if (!on_stream || !queued(stream)) {
    // the legacy default stream (cudaMemcpy, or an async copy on it): after
    // every blocking stream's queued work
    if (async_flag()) drain_blocking();
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  if (kind == cudaMemcpyDeviceToHost && !is_pinned(dst)) {
    // to pageable memory: returns once the copy has completed
    drain(stream);
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  if (kind == cudaMemcpyHostToDevice && !is_pinned(src)) {
    // from pageable memory: staged at the call, so the caller may reuse it at once
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    submit(stream, [dst, staged, bytes] {
      if (!find_alloc(dst, bytes)) return use_after_free("cudaMemcpyAsync");
      std::memcpy(dst, staged->data(), bytes);
    });
    return cudaSuccess;
  }
  submit(stream, [dst, src, bytes, kind] {
    if (copy_problem(dst, src, bytes, kind)) return use_after_free("cudaMemcpyAsync");
    std::memmove(dst, src, bytes);
  });
  return cudaSuccess;
}

cudaError_t memset_impl(void* dst, int value, size_t bytes, cudaStream_t stream) {
  const auto held = lock();
  if (bytes == 0) return cudaSuccess;
  if (!find_alloc(dst, bytes)) return fail(cudaErrorInvalidValue, "cudaMemset: not inside one device allocation");
  submit(stream, [dst, value, bytes] {
    if (!find_alloc(dst, bytes)) return use_after_free("cudaMemsetAsync");
    std::memset(dst, value, bytes);
  });
  return cudaSuccess;
}

}  // namespace

namespace dynamiq_cuda_emu {

void log_call(const char* name, cudaStream_t stream) {
  const auto held = lock();
  if (g_log) g_log->push_back(ApiCall{name, stream, std::this_thread::get_id()});
}

void set_api_log(bool on) {
  const auto held = lock();
  delete g_log;
  g_log = on ? new std::vector<ApiCall>() : nullptr;
}

std::vector<ApiCall> api_log() {
  const auto held = lock();
  return g_log ? *g_log : std::vector<ApiCall>();
}

CopyCounts copy_counts() {
  const auto held = lock();
  return g_copies;
}

void reset_copy_counts() {
  const auto held = lock();
  g_copies = CopyCounts();
}

void submit(cudaStream_t stream, std::function<void()> work) {
  const auto held = lock();
  if (queued(stream)) {
    queues()[stream].work.push_back(std::move(work));
    return;
  }
  if (async_flag()) drain_blocking();  // the legacy default stream (or an unknown handle)
  work();
}

bool set_async_streams(bool on) {
  const auto held = lock();
  drain_all();
  const bool prev = async_flag();
  async_flag() = on;
  return prev;
}

bool async_streams() {
  const auto held = lock();
  return async_flag();
}

static bool g_skip_kernels = false;  // set_skip_kernels

bool set_skip_kernels(bool on) {
  const auto held = lock();
  const bool prev = g_skip_kernels;
  g_skip_kernels = on;
  return prev;
}

bool skip_kernels_locked() { return g_skip_kernels; }

bool set_memory_pools_supported(bool on) {
  const auto held = lock();
  const bool prev = g_pools_supported;
  g_pools_supported = on;
  return prev;
}

}  // namespace dynamiq_cuda_emu

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  log_call("cudaMalloc", nullptr);
  return malloc_impl(ptr, bytes);
}

cudaError_t cudaFree(void* ptr) {
  const auto held = lock();
  log_call("cudaFree", nullptr);
  drain_all();  // cudaFree waits for the whole device
  return free_impl(ptr);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  log_call("cudaMemcpy", nullptr);
  return memcpy_impl(dst, src, bytes, kind, nullptr, false);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  log_call("cudaMemcpyAsync", stream);
  return memcpy_impl(dst, src, bytes, kind, stream, true);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  log_call("cudaMemset", nullptr);
  return memset_impl(dst, value, bytes, nullptr);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  log_call("cudaMemsetAsync", stream);
  return memset_impl(dst, value, bytes, stream);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  const auto held = lock();
  log_call("cudaStreamSynchronize", stream);
  if (stream == nullptr)
    drain_blocking();
  else
    drain(stream);
  return g_sticky;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  const auto held = lock();
  log_call("cudaStreamQuery", stream);
  auto it = queues().find(stream);
  if (it == queues().end() || it->second.work.empty()) return g_sticky;
  drain(stream);  // not ready now; done by the next query (polling progresses)
  return cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize() {
  const auto held = lock();
  log_call("cudaDeviceSynchronize", nullptr);
  drain_all();
  return g_sticky;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  const auto held = lock();
  if (!stream) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: null result pointer");
  *stream = reinterpret_cast<cudaStream_t>(new char);  // a distinct handle
  queues()[*stream].blocking = (flags & cudaStreamNonBlocking) == 0;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  const auto held = lock();
  drain(stream);  // its queued work still completes
  queues().erase(stream);
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  const auto held = lock();
  if (!event) return fail(cudaErrorInvalidValue, "cudaEventCreate: null result pointer");
  *event = new CUevent_st();
  events().insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  const auto held = lock();
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: not a live event");
  events().erase(event);
  delete event;  // a queued record keeps its state
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  const auto held = lock();
  log_call("cudaEventRecord", stream);
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: not a live event");
  auto st = event->s;
  const uint64_t gen = ++st->generation;
  st->done = false;
  st->queried = false;
  st->stream = stream;
  submit(stream, [st, gen] {
    if (st->generation != gen) return;  // recorded again since: that record counts
    st->done = true;
    st->at = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  const auto held = lock();
  log_call("cudaEventSynchronize", nullptr);
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not a live event");
  run_to(event->s);
  return g_sticky;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  const auto held = lock();
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: not a live event");
  auto st = event->s;
  if (st->done) return g_sticky;
  if (!st->queried) {  // not yet; the work before it runs now, for the next query
    st->queried = true;
    return cudaErrorNotReady;
  }
  run_to(st);
  return g_sticky;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const auto held = lock();
  if (!ms || !live_event(start) || !live_event(end))
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: invalid argument");
  if (!start->s->done || !end->s->done) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->s->at - start->s->at).count();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  const auto held = lock();
  log_call("cudaStreamWaitEvent", stream);
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: not a live event");
  auto st = event->s;
  if (st->done) return cudaSuccess;
  // the state as of now: a later record of the event does not count
  const uint64_t gen = st->generation;
  submit(stream, [st, gen] {
    if (st->generation == gen) run_to(st);
  });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  const auto held = lock();
  log_call("cudaHostAlloc", nullptr);
  if (!ptr) return fail(cudaErrorInvalidValue, "cudaHostAlloc: null result pointer");
  const size_t n = bytes ? bytes : 1;
  void* p = std::malloc(n);
  if (!p) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc: out of memory");
  std::memset(p, kFill, n);
  pinned()[reinterpret_cast<uintptr_t>(p)] = n;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
  const auto held = lock();
  log_call("cudaFreeHost", nullptr);
  if (!ptr) return cudaSuccess;
  drain_all();  // waits for the whole device, as cudaFree
  auto it = pinned().find(reinterpret_cast<uintptr_t>(ptr));
  if (it == pinned().end()) return fail(cudaErrorInvalidValue, "cudaFreeHost: not a page-locked allocation");
  pinned().erase(it);
  std::free(ptr);
  return cudaSuccess;
}

thread_local int g_device = 0;

cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0) return fail(cudaErrorInvalidValue, "cudaSetDevice: negative device");
  g_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  const auto held = lock();
  if (attr != cudaDevAttrMemoryPoolsSupported)
    return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute not emulated");
  *value = g_pools_supported ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (!pool || !props || props->location.type != cudaMemLocationTypeDevice)
    return fail(cudaErrorInvalidValue, "cudaMemPoolCreate: invalid argument");
  *pool = reinterpret_cast<cudaMemPool_t>(new char);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr, void* value) {
  if (!pool || !value) return fail(cudaErrorInvalidValue, "cudaMemPoolSetAttribute: invalid argument");
  return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) {
  if (!pool) return fail(cudaErrorInvalidValue, "cudaMemPoolTrimTo: null pool");
  log_call("cudaMemPoolTrimTo", nullptr);
  return cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t bytes, cudaMemPool_t pool, cudaStream_t stream) {
  if (!pool) return fail(cudaErrorInvalidValue, "cudaMallocFromPoolAsync: null pool");
  log_call("cudaMallocFromPoolAsync", stream);
  return malloc_impl(ptr, bytes);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  const auto held = lock();
  log_call("cudaFreeAsync", stream);
  if (ptr && !allocs().count(reinterpret_cast<uintptr_t>(ptr)))
    return fail(cudaErrorInvalidDevicePointer, "cudaFreeAsync: not a live allocation");
  submit(stream, [ptr] { free_impl(ptr); });  // in stream order
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const auto held = lock();
  const cudaError_t e = g_last;
  g_last = g_sticky;
  return e;
}

cudaError_t cudaPeekAtLastError() { return g_last; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
  }
  return "unknown error";
}

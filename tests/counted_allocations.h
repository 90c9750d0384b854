// Counts every allocation of the test binary that includes this header, to prove a hot path
// allocates nothing once warmed up: read tandem::test::g_allocations before and after. Replaces
// the global operator new/delete pairs (malloc and free back both; GCC's mismatch warning does
// not see that), so include it from exactly one file of a binary.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace tandem::test {
inline std::atomic<long> g_allocations{0};
inline void* counted_malloc(std::size_t size) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
}  // namespace tandem::test

void* operator new(std::size_t size) {
  if (void* p = tandem::test::counted_malloc(size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return tandem::test::counted_malloc(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return tandem::test::counted_malloc(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

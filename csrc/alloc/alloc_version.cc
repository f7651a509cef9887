// Keeps the alloc library non-empty while it has no other sources; the
// allocator (csrc/alloc) records its format version here.
namespace dynamiq {
int alloc_format_version() { return 1; }
}  // namespace dynamiq

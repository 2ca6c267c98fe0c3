// gemv_prefetch.cu -- the L2 prefetch plan's table and its C entry (gemv_prefetch.cuh says what it is for).
#include "gemv_prefetch.cuh"

#include <mutex>
#include <unordered_map>

namespace fd {
namespace {
constexpr size_t MAX_ENTRIES = 4096;   // a few models' projections (4 launches a layer)
std::mutex mu;
std::unordered_map<const void*, PrefetchRanges>& table() {
    static std::unordered_map<const void*, PrefetchRanges> t;
    return t;
}
}  // namespace

bool gemv_prefetch_lookup(const void* key, PrefetchRanges* out) {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = table().find(key);
    if (it == table().end()) {
        out->n = 0;
        return false;
    }
    *out = it->second;
    return true;
}

}  // namespace fd

extern "C" int fd_gemv_prefetch_set(const void* key, int n, const void* const* ptrs, const size_t* bytes) {
    FD_CHECK_ARG(key != nullptr && n >= 0 && n <= fd::MAX_PREFETCH && (n == 0 || (ptrs != nullptr && bytes != nullptr)));
    fd::PrefetchRanges r{};
    for (int k = 0; k < n; ++k) {
        FD_CHECK_ARG(ptrs[k] != nullptr);
        r.ptr[k] = static_cast<const uint8_t*>(ptrs[k]);
        r.bytes[k] = bytes[k];
    }
    r.n = n;
    std::lock_guard<std::mutex> lock(fd::mu);
    auto& t = fd::table();
    if (n == 0) {
        t.erase(key);
        return 0;
    }
    if (t.size() >= fd::MAX_ENTRIES && t.find(key) == t.end()) return FD_E_ARG;
    t[key] = r;
    return 0;
}

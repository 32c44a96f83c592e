// The 2-CTA pair schedule of the routed-M GEMMs (ffi/cuda/device/cluster.cuh), run on the CPU:
// for random expert counts, every (expert, m-tile, n-tile) of the single-CTA schedule is covered
// exactly once by the pair tiles' two ranks, with its rows; a shared pair's ranks hold m-tiles 2j
// and 2j + 1 of one (expert, n-tile); a single pair's ranks share the n-tile; at most one rank per
// n-tile is idle (rows == 0), and only where the count of singles is odd. Also the layout of the
// epilogue warpgroup's g buffer (epilogue_staged.cuh: g_offset): one place per bf16 pair inside
// the 64 KB, and no shared-memory bank conflict in the consumers' fragment stores (each warp
// instruction: 32 lanes, 4-byte pairs) or the epilogue warps' row reads (16 bytes a lane). Exit
// status 1 and a line naming the case on the first violation. Built and run by
// tests/test_pair_schedule.py.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "cuda/device/cluster.cuh"
#include "cuda/device/epilogue_staged.cuh"

namespace {

struct Params {  // the fields decode_pair_routed and pair_total_tiles read
  int experts, n_tiles, K;
};

int fail(int c, const char* what, int tile, int rank) {
  std::printf("case %d: %s (tile %d, rank %d)\n", c, what, tile, rank);
  return 1;
}

}  // namespace

// Bank of each 4-byte word a warp instruction touches: 32 banks of 4 bytes; the instruction is
// conflict-free when no bank is asked for two different words.
bool conflict_free(const std::vector<uint32_t>& byte_addrs) {
  std::map<int, uint32_t> word_of_bank;
  for (uint32_t a : byte_addrs) {
    const int bank = static_cast<int>((a / 4) % 32);
    auto it = word_of_bank.find(bank);
    if (it != word_of_bank.end() && it->second != a / 4) return false;
    word_of_bank[bank] = a / 4;
  }
  return true;
}

int check_g_layout() {
  using mok::cuda::frag_col;
  using mok::cuda::frag_row;
  using mok::cuda::fp8::g_offset;
  std::map<uint32_t, int> used;
  for (int row = 0; row < 128; ++row)
    for (int col = 0; col < 256; col += 2) {
      const uint32_t off = g_offset(row, col);
      if (off % 4 != 0 || off + 4 > 128 * 256 * 2 || used.count(off)) {
        std::printf("g layout: row %d col %d at %u (not a free aligned word)\n", row, col, off);
        return 1;
      }
      used[off] = 1;
    }
  // Consumer stores: warp w of warpgroup wg, value pair i (even) of 128: 32 lanes at once.
  for (int wg = 0; wg < 2; ++wg)
    for (int warp = 0; warp < 4; ++warp)
      for (int i = 0; i < 128; i += 2) {
        std::vector<uint32_t> addrs;
        for (int lane = 0; lane < 32; ++lane) {
          const int t = 32 * warp + lane, j = i & 63;
          addrs.push_back(g_offset(64 * wg + frag_row(j, t), (i >> 6) * 128 + frag_col(j, t)));
        }
        if (!conflict_free(addrs)) {
          std::printf("g layout: bank conflict in the consumers' store of pair %d\n", i);
          return 1;
        }
      }
  // Epilogue reads: one row per warp, lane l the 16 bytes of columns 8l..8l+7, in four 8-lane
  // phases of 128 bytes (a 16-byte access per lane is served a quarter-warp at a time).
  for (int row = 0; row < 128; ++row)
    for (int phase = 0; phase < 4; ++phase) {
      std::vector<uint32_t> addrs;
      for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane)
        for (int word = 0; word < 4; ++word) addrs.push_back(g_offset(row, 8 * lane) + 4 * word);
      if (!conflict_free(addrs)) {
        std::printf("g layout: bank conflict in the epilogue's read of row %d\n", row);
        return 1;
      }
    }
  std::printf("g layout: ok\n");
  return 0;
}

int main() {
  using mok::cuda::kTileM;
  if (check_g_layout() != 0) return 1;
  std::mt19937 rng(1234);
  for (int c = 0; c < 400; ++c) {
    const int experts = 1 + static_cast<int>(rng() % 300);
    const int n_tiles = 1 + static_cast<int>(rng() % 4);
    std::vector<int> count(experts);
    for (int& x : count) {  // zero, one tile, a few, many
      const int kind = static_cast<int>(rng() % 4);
      x = kind == 0 ? 0 : kind == 1 ? 1 + rng() % kTileM : kind == 2 ? rng() % 700 : rng() % 3000;
    }
    std::vector<int> offset(experts + 1, 0), prefix(experts + 1, 0);
    int singles = 0;
    for (int e = 0; e < experts; ++e) {
      offset[e + 1] = offset[e] + count[e];
      const int m = (count[e] + kTileM - 1) / kTileM;
      prefix[e + 1] = prefix[e] + mok::cuda::pair_packed(m);
      singles += m & 1;
    }
    const Params p{experts, n_tiles, 64};
    const int total = mok::cuda::pair_total_tiles(p, prefix.data());
    std::map<std::tuple<int, int, int>, int> seen;  // (expert, m-tile, n-tile) -> times
    int idle = 0;
    for (int tile = 0; tile < total; ++tile) {
      bool shared[2];
      mok::cuda::WorkTile w[2];
      for (int rank = 0; rank < 2; ++rank) {
        w[rank] = mok::cuda::decode_pair_routed(p, tile, prefix.data(), offset.data(),
                                                static_cast<uint32_t>(rank), shared[rank]);
        const mok::cuda::WorkTile& t = w[rank];
        if (t.expert < 0 || t.expert >= experts || t.n_tile < 0 || t.n_tile >= n_tiles)
          return fail(c, "expert or n-tile out of range", tile, rank);
        if (t.k_off != 0 || t.k_len != p.K) return fail(c, "K range", tile, rank);
        if (t.rows == 0) {
          ++idle;
          continue;
        }
        const int local = t.row0 - offset[t.expert];
        if (local < 0 || local % kTileM != 0) return fail(c, "row0 not an m-tile", tile, rank);
        const int m = local / kTileM;
        const int want = count[t.expert] - local < kTileM ? count[t.expert] - local : kTileM;
        if (t.rows != want || want <= 0) return fail(c, "rows", tile, rank);
        ++seen[{t.expert, m, t.n_tile}];
      }
      if (shared[0] != shared[1]) return fail(c, "ranks disagree on sharing", tile, 0);
      if (w[0].n_tile != w[1].n_tile) return fail(c, "ranks on different n-tiles", tile, 0);
      if (shared[0] && (w[0].expert != w[1].expert || w[1].row0 != w[0].row0 + kTileM ||
                        (w[0].row0 - offset[w[0].expert]) % (2 * kTileM) != 0))
        return fail(c, "a shared pair is not m-tiles 2j, 2j + 1 of one expert", tile, 0);
      if (!shared[0] && w[0].rows == 0) return fail(c, "a single pair's rank 0 idle", tile, 0);
    }
    for (int e = 0; e < experts; ++e)
      for (int m = 0; m * kTileM < count[e]; ++m)
        for (int n = 0; n < n_tiles; ++n) {
          auto it = seen.find({e, m, n});
          if (it == seen.end() || it->second != 1) {
            std::printf("case %d: expert %d m-tile %d n-tile %d covered %d times\n", c, e, m, n,
                        it == seen.end() ? 0 : it->second);
            return 1;
          }
        }
    if (idle != (singles & 1) * n_tiles) {
      std::printf("case %d: %d idle ranks, expected %d\n", c, idle, (singles & 1) * n_tiles);
      return 1;
    }
  }
  std::printf("pair schedule: 400 cases ok\n");
  return 0;
}

// The 2-CTA pair schedule of the routed-M GEMMs (ffi/cuda/device/cluster.cuh), run on the CPU:
// for random expert counts, every (expert, m-tile, n-tile) of the single-CTA schedule is covered
// exactly once by the pair tiles' two ranks, with its rows; a shared pair's ranks hold m-tiles 2j
// and 2j + 1 of one (expert, n-tile); a single pair's ranks hold the last m-tile of one expert on
// n-tiles 2g, 2g + 1; pair ids run expert by expert (a weight tile's readers together); an idle
// rank (rows == 0) only as rank 1 of a single pair, once per expert with an odd m-tile count when
// the n-tile count is odd. Exit status 1 and a line naming the case on the first violation. Built
// and run by tests/test_pair_schedule.py.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "cuda/device/cluster.cuh"

namespace {

struct Params {  // the fields decode_pair_routed and pair_total_tiles read
  int experts, n_tiles, K;
};

int fail(int c, const char* what, int tile, int rank) {
  std::printf("case %d: %s (tile %d, rank %d)\n", c, what, tile, rank);
  return 1;
}

}  // namespace

int main() {
  using mok::cuda::kTileM;
  std::mt19937 rng(1234);
  for (int c = 0; c < 400; ++c) {
    const int experts = 1 + static_cast<int>(rng() % 300);
    const int n_tiles = 1 + static_cast<int>(rng() % 5);
    std::vector<int> count(experts);
    for (int& x : count) {  // zero, one tile, a few, many
      const int kind = static_cast<int>(rng() % 4);
      x = kind == 0 ? 0 : kind == 1 ? 1 + rng() % kTileM : kind == 2 ? rng() % 700 : rng() % 3000;
    }
    std::vector<int> offset(experts + 1, 0), prefix(experts + 1, 0);
    int odd_experts = 0;
    for (int e = 0; e < experts; ++e) {
      offset[e + 1] = offset[e] + count[e];
      const int m = (count[e] + kTileM - 1) / kTileM;
      prefix[e + 1] = prefix[e] + mok::cuda::pair_tiles(m, n_tiles);
      odd_experts += m & 1;
    }
    const Params p{experts, n_tiles, 64};
    const int total = mok::cuda::pair_total_tiles(p, prefix.data());
    std::map<std::tuple<int, int, int>, int> seen;  // (expert, m-tile, n-tile) -> times
    int idle = 0, last_expert = 0;
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
      if (w[0].expert != w[1].expert) return fail(c, "ranks on different experts", tile, 0);
      if (w[0].expert < last_expert) return fail(c, "pair ids not expert by expert", tile, 0);
      last_expert = w[0].expert;
      if (shared[0] && (w[0].n_tile != w[1].n_tile || w[1].row0 != w[0].row0 + kTileM ||
                        (w[0].row0 - offset[w[0].expert]) % (2 * kTileM) != 0 || w[0].rows == 0))
        return fail(c, "a shared pair is not m-tiles 2j, 2j + 1 of one (expert, n-tile)", tile, 0);
      if (!shared[0]) {
        const int last = offset[w[0].expert] +
                         (count[w[0].expert] - 1) / kTileM * kTileM;  // the last m-tile
        if (w[0].rows == 0 || w[0].row0 != last || w[0].n_tile % 2 != 0)
          return fail(c, "a single pair's rank 0 is not a last m-tile on an even n-tile", tile, 0);
        if (w[1].rows != 0 && (w[1].row0 != last || w[1].n_tile != w[0].n_tile + 1))
          return fail(c, "a single pair's rank 1 is not the next n-tile", tile, 1);
        if (w[1].rows == 0 && w[0].n_tile != n_tiles - 1)
          return fail(c, "a single pair's rank 1 idle before the last n-tile", tile, 1);
      }
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
    if (idle != odd_experts * (n_tiles & 1)) {
      std::printf("case %d: %d idle ranks, expected %d\n", c, idle, odd_experts * (n_tiles & 1));
      return 1;
    }
  }
  std::printf("pair schedule: 400 cases ok\n");
  return 0;
}

// Paged attention on CPU, reading K/V through the block table in place.
// Semantics: kernels/reference.py paged_attention_ref (layout in docs/kernels.md), with its
// sliding window (window > 0: a query at position p sees keys p - window < j <= p; key tiles
// before an item's first window are never read) and soft-capping (softcap > 0).
//
// Work item = (sequence, tile of up to kChunkTokens query tokens), every head: the item
// streams each cache block once, all KV heads of a position being contiguous, and each K/V
// row serves its whole GQA group. Online softmax per row in float32, over tiles of kKeyTile
// context positions (attention_tiles.h). A token's GQA group shares each key's load
// (group_scores), and every query row, decode or prompt, goes through that same arithmetic:
// a row's bits do not depend on its neighbours, so a lone decode can be split by heads over
// the threads, and chunking or batching changes no token. (Prompt chunks once transposed
// each key tile for a broadcast-FMA per row: faster for long prompts, but another summation
// order, so a prompt's tokens changed with its chunking and its company.)
//
// The cache may be stored in another type than the query (kernels/kv_quant.py): bfloat16,
// float8 (widened in registers) or int8 rows with a float16 scale after their head_dim
// values. A row's scale factors out of its dot and its value's weight: keys' scales multiply
// their scores, values' scales their probabilities, so no block is ever copied to float.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "attention_tiles.h"
#include "vec_math.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kChunkTokens = 32;     // query tokens per work item
// Row-keys (query rows times the keys each sees) under which a call runs on one thread:
// about 5 us of work from cache (twice that from memory), against the ~2.5 it takes to
// wake the others.
constexpr int64_t kParallelCost = 1024;

using namespace folio_cpu;

struct Item {
  int32_t seq, q_begin, q_end;   // query rows [q_begin, q_end) of `seq`,
  int32_t h_begin, h_end;        // heads [h_begin, h_end) of them
  int64_t cost;                  // rows times the keys they see
};

struct Args {
  const int32_t* tables;
  int64_t table_stride;
  const int32_t* seq_lens;
  const int32_t* starts;
  int64_t block_size, head_dim, heads, kv_heads;
  int64_t cache_s0, cache_s1, cache_s2;
  float scale;
  int64_t window;    // 0: full causal attention
  float softcap;     // 0: none
  const float* sinks;   // nullptr: none; else [heads] logits in every row's denominator
};

template <typename T>
struct Rows {  // [tokens, heads, head_dim] with any strides but a packed last dim
  T* data;
  int64_t s0, s1;
  T* row(int64_t i, int64_t j) const { return data + i * s0 + j * s1; }
};

template <typename T, typename C, int kD>
void run_item(const Item& item, const Args& a, const Rows<const T>& query, const C* key_cache,
              const C* value_cache, const Rows<T>& out, std::vector<float>& buffer) {
  const int64_t D = kD > 0 ? kD : a.head_dim;
  const int64_t H = a.heads, G = a.heads / a.kv_heads;
  const int64_t tokens = item.q_end - item.q_begin, rows = tokens * H;
  const int64_t q_start = a.starts[item.seq];
  const int64_t first_pos = a.seq_lens[item.seq] - (a.starts[item.seq + 1] - q_start);
  buffer.assign(rows * (2 * D + 2) + kKeyTile * kBlockRows, 0.0f);
  float* q = buffer.data();              // [rows, D], pre-scaled; row r = token * H + head
  float* acc = q + rows * D;             // [rows, D]
  float* row_max = acc + rows * D;       // [rows]
  float* row_sum = row_max + rows;       // [rows]
  float* scores = row_sum + rows;        // [kBlockRows, kKeyTile], then the probabilities
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = item.h_begin; h < item.h_end; ++h) {
      const T* src = query.row(q_start + item.q_begin + t, h);
      float* dst = q + (t * H + h) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = load(src[d]) * a.scale;
      // A sink is a key of logit sinks[h] and no value: the softmax starts from it.
      row_max[t * H + h] = a.sinks != nullptr ? a.sinks[h] : kNoScore;
      row_sum[t * H + h] = a.sinks != nullptr ? 1.0f : 0.0f;
    }
  }
  const int32_t* table = a.tables + item.seq * a.table_stride;
  const int64_t context = first_pos + item.q_end;   // positions this item's last row sees
  // The first position the item's first row sees: earlier blocks may have been freed.
  const int64_t first_key =
      a.window > 0 ? std::max<int64_t>(0, first_pos + item.q_begin + 1 - a.window) : 0;
  // One head's row: its values and an int8 row's scale (a compile-time size when kD > 0).
  const int64_t row_bytes = (D + (kScaledRows<C> ? 2 : 0)) * static_cast<int64_t>(sizeof(C));
  auto prefetch_row = [&](const C* row) {   // into L2; an int8 row may straddle a line
    const char* p = reinterpret_cast<const char*>(row);
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
    if (row_bytes % 64 != 0) __builtin_prefetch(p + row_bytes - 1, 0, 2);
  };
  // offsets[j]: position p0 + j's row in the caches, for j < n. One division per tile:
  // a 64-bit division per position cost more than a decode row's dot with it.
  auto tile_offsets = [&](int64_t p0, int64_t n, int64_t* offsets) {
    int64_t block = p0 / a.block_size, row = p0 % a.block_size;
    for (int64_t j = 0; j < n; ++j) {
      offsets[j] = table[block] * a.cache_s0 + row * a.cache_s1;
      if (++row == a.block_size) row = 0, ++block;
    }
  };
  int64_t offsets[2][kKeyTile];   // this tile's and the next one's
  const int64_t n_first = std::min(context, (first_key / kKeyTile + 1) * kKeyTile) - first_key;
  tile_offsets(first_key, n_first, offsets[0]);
  // The first tile's rows all at once too: many misses in flight, not one per load.
  for (int64_t kv = item.h_begin / G; kv * G < item.h_end; ++kv) {
    for (int64_t j = 0; j < n_first; ++j) {
      prefetch_row(key_cache + offsets[0][j] + kv * a.cache_s2);
      prefetch_row(value_cache + offsets[0][j] + kv * a.cache_s2);
    }
  }
  const C* keys[kKeyTile];
  const C* values[kKeyTile];
  float key_scales[kKeyTile], value_scales[kKeyTile];   // int8 rows' (kScaledRows<C>)
  // Tiles end at multiples of kKeyTile whatever first_key is (a window's first tile is
  // partial): a row's tiles, and so its rounding, do not depend on where its item starts.
  for (int64_t p0 = first_key, next = 0, tile = 0; p0 < context; p0 = next, tile ^= 1) {
    next = (p0 / kKeyTile + 1) * kKeyTile;
    const int64_t n = std::min(next, context) - p0;
    for (int64_t j = 0; j < n; ++j) {
      keys[j] = key_cache + offsets[tile][j];
      values[j] = value_cache + offsets[tile][j];
    }
    const int64_t n_next = std::min(context, next + kKeyTile) - next;
    if (n_next > 0) tile_offsets(next, n_next, offsets[tile ^ 1]);
    for (int64_t kv = item.h_begin / G; kv * G < item.h_end; ++kv) {
      const int64_t head_offset = kv * a.cache_s2;
      // The item's rows of this KV head's group: all of it unless the item was split.
      const int64_t g_begin = std::max<int64_t>(0, item.h_begin - kv * G);
      const int64_t g_end = std::min<int64_t>(G, item.h_end - kv * G);
      // Blocks are scattered, so the hardware prefetcher cannot guess the next tile: fetch
      // this head's rows of it into L2 while this one is computed. (Into L1, or the whole
      // tile at once, stalled on the misses instead: the tile is L1's size.)
      for (int64_t j = 0; j < n_next; ++j) {
        prefetch_row(key_cache + offsets[tile ^ 1][j] + head_offset);
        prefetch_row(value_cache + offsets[tile ^ 1][j] + head_offset);
      }
      if constexpr (kScaledRows<C>) {
        for (int64_t j = 0; j < n; ++j) {
          key_scales[j] = row_scale(keys[j] + head_offset, D);
          value_scales[j] = row_scale(values[j] + head_offset, D);
        }
      }
      // Int8 rows: scores [lo, hi) times their keys' scales (before soft-capping).
      auto scale_scores = [&](float* row_scores, int64_t lo, int64_t hi) {
        if constexpr (kScaledRows<C>) {
          for (int64_t j = lo; j < hi; ++j) row_scores[j] *= key_scales[j];
        }
      };
      // Int8 rows: probabilities [lo, hi) times their values' scales, once the row's sum
      // has them (softmax_row), so they only weight the values.
      auto scale_probabilities = [&](float* probs, int64_t lo, int64_t hi) {
        if constexpr (kScaledRows<C>) {
          for (int64_t j = lo; j < hi; ++j) probs[j] *= value_scales[j];
        }
      };
      // A row's scores [lo, hi) -> probabilities, rescaling its running sum and accumulator.
      auto softmax_row = [&](int64_t r, float* row_scores, int64_t lo, int64_t hi) {
        if (a.softcap > 0.0f) {
          const float inv_cap = 1.0f / a.softcap;
          for (int64_t j = lo; j < hi; ++j)
            row_scores[j] = a.softcap * std::tanh(row_scores[j] * inv_cap);
        }
        const float old_max = row_max[r];
        const float sum = softmax_tile(row_scores + lo, hi - lo, row_max[r]);
        const float correction = exp_nonpositive(old_max - row_max[r]);
        row_sum[r] = row_sum[r] * correction + sum;
        float* ar = acc + r * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ar[d] *= correction;
      };
      // Causal: token t of the item sits at position first_pos + q_begin + t; it sees tile
      // columns [lo, hi).
      auto visible_columns = [&](int64_t t, int64_t& lo, int64_t& hi) {
        const int64_t position = first_pos + item.q_begin + t;
        hi = std::min<int64_t>(n, position + 1 - p0);
        lo = a.window > 0 ? std::max<int64_t>(0, position + 1 - a.window - p0) : 0;
      };
      // Rows t * H + kv * G + [g, g + R) of one token, in one pass over the tile's keys
      // and values (kD > 0, R <= kBlockRows).
      auto group_rows = [&](auto rows_tag, int64_t t, int64_t g, int64_t lo, int64_t hi) {
        constexpr int R = decltype(rows_tag)::value;
        const float* qs[R];
        float* row_scores[R];
        float* accs[R];
        const float* probs[R];
        for (int b = 0; b < R; ++b) {
          qs[b] = q + (t * H + kv * G + g + b) * D;
          row_scores[b] = scores + b * kKeyTile;
          accs[b] = acc + (t * H + kv * G + g + b) * D;
        }
        group_scores<R, C, kD>(qs, keys, head_offset, lo, hi, row_scores);
        for (int b = 0; b < R; ++b) {
          scale_scores(row_scores[b], lo, hi);
          softmax_row(t * H + kv * G + g + b, row_scores[b], lo, hi);
          scale_probabilities(row_scores[b], lo, hi);
          probs[b] = row_scores[b] + lo;
        }
        if constexpr (R == 1) {
          accumulate<C, kD>(accs[0], probs[0], values + lo, head_offset, hi - lo, D);
        } else {
          accumulate_block<R, C, kD>(accs, probs, values + lo, head_offset, hi - lo);
        }
      };
      for (int64_t t = 0; t < tokens; ++t) {
        int64_t lo = 0, hi = 0;
        visible_columns(t, lo, hi);
        if (hi <= lo) continue;
        const int64_t visible = hi - lo;
        if constexpr (kD > 0) {   // the group shares each key's load
          for (int64_t g = g_begin; g < g_end; g += kBlockRows) {
            switch (std::min<int64_t>(g_end - g, kBlockRows)) {
              case 1: group_rows(std::integral_constant<int, 1>{}, t, g, lo, hi); break;
              case 2: group_rows(std::integral_constant<int, 2>{}, t, g, lo, hi); break;
              case 3: group_rows(std::integral_constant<int, 3>{}, t, g, lo, hi); break;
              default: group_rows(std::integral_constant<int, 4>{}, t, g, lo, hi); break;
            }
          }
          continue;
        }
        for (int64_t g = g_begin; g < g_end; ++g) {   // kD == 0: any head_dim
          const int64_t r = t * H + kv * G + g;
          const float* qr = q + r * D;
          for (int64_t j = lo; j < hi; ++j) scores[j] = dot(qr, keys[j] + head_offset, D);
          scale_scores(scores, lo, hi);
          softmax_row(r, scores, lo, hi);
          scale_probabilities(scores, lo, hi);
          accumulate<C, kD>(acc + r * D, scores + lo, values + lo, head_offset, visible, D);
        }
      }
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = item.h_begin; h < item.h_end; ++h) {
      const int64_t r = t * H + h;
      const float inv = 1.0f / row_sum[r];
      T* dst = out.row(q_start + item.q_begin + t, h);
      for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<T>(acc[r * D + d] * inv);
    }
  }
}

at::Tensor as_int32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
              " must be int32 or int64, got ", t.scalar_type());
  return t.to(at::kInt).contiguous();
}

void check_rows(const at::Tensor& t, const char* name, int64_t heads, int64_t head_dim) {
  TORCH_CHECK(t.dim() == 3 && t.size(1) == heads && t.size(2) == head_dim, name,
              " must be [T, ", heads, ", ", head_dim, "], got ", t.sizes());
  TORCH_CHECK(t.stride(2) == 1, name, " must have a packed last dimension");
}

void attend(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
            const at::Tensor& value_cache, const at::Tensor& block_tables_in,
            const at::Tensor& seq_lens_in, const at::Tensor& query_start_loc_in, double scale,
            int64_t window, double softcap, const float* sinks) {
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none), got ", window);
  TORCH_CHECK(softcap >= 0.0, "softcap must be >= 0 (0: none), got ", softcap);
  for (const at::Tensor* t : {&out, &query, &key_cache, &value_cache})
    TORCH_CHECK(t->device().is_cpu(), "paged_attention_cpu needs CPU tensors");
  const auto dtype = query.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "query must be float32 or bfloat16, got ", dtype);
  const auto cache_dtype = key_cache.scalar_type();
  TORCH_CHECK(out.scalar_type() == dtype, "query and out must share a dtype");
  TORCH_CHECK(value_cache.scalar_type() == cache_dtype,
              "key_cache and value_cache must share a dtype");
  TORCH_CHECK(cache_dtype == dtype || cache_dtype == at::kBFloat16 || cache_dtype == at::kChar ||
                  cache_dtype == at::kFloat8_e4m3fn || cache_dtype == at::kFloat8_e5m2,
              "the cache must be stored as the query's dtype, bfloat16, int8 or float8 "
              "(e4m3fn, e5m2), got ", cache_dtype);
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes() &&
                  value_cache.strides() == key_cache.strides(),
              "key_cache and value_cache must be [num_blocks, block_size, kv_heads, head_dim] "
              "with the same layout");
  TORCH_CHECK(key_cache.stride(3) == 1, "caches must have a packed last dimension");
  const int64_t block_size = key_cache.size(1), kv_heads = key_cache.size(2);
  const int64_t head_dim = query.size(2), heads = query.size(1);
  // int8 rows end with their float16 scale (kernels/kv_quant.py).
  const int64_t row_width = head_dim + (cache_dtype == at::kChar ? 2 : 0);
  TORCH_CHECK(key_cache.size(3) == row_width, "the cache's rows must be ", row_width,
              " wide for head_dim ", head_dim, " and a ", cache_dtype, " cache, got ",
              key_cache.size(3));
  check_rows(query, "query", heads, head_dim);
  check_rows(out, "out", heads, head_dim);
  TORCH_CHECK(out.size(0) == query.size(0), "out must have query's shape");
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0,
              "num_heads must be a multiple of num_kv_heads");
  const at::Tensor tables = as_int32(block_tables_in, "block_tables");
  const at::Tensor seq_lens = as_int32(seq_lens_in, "seq_lens");
  const at::Tensor starts = as_int32(query_start_loc_in, "query_start_loc");
  const int64_t num_seqs = seq_lens.numel();
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == num_seqs && starts.numel() == num_seqs + 1,
              "block_tables must be [S, M] and query_start_loc [S + 1] for S = len(seq_lens)");

  Args a{tables.data_ptr<int32_t>(), tables.size(1), seq_lens.data_ptr<int32_t>(),
         starts.data_ptr<int32_t>(), block_size, head_dim, heads, kv_heads,
         key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
         static_cast<float>(scale), window, static_cast<float>(softcap), sinks};
  // Decodes: one item per sequence. Chunks: kChunkTokens tokens per item.
  std::vector<Item> items;
  int64_t total_cost = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = a.starts[s + 1] - a.starts[s];
    const int64_t first_pos = a.seq_lens[s] - q_len;
    TORCH_CHECK(q_len >= 0 && first_pos >= 0 && a.starts[s + 1] <= query.size(0),
                "sequence ", s, ": query_start_loc and seq_lens are inconsistent");
    const int64_t blocks = (a.seq_lens[s] + block_size - 1) / block_size;
    TORCH_CHECK(blocks <= tables.size(1),
                "sequence ", s, ": seq_len needs more blocks than block_tables has columns");
    // On the CPU the ids are at hand: a bad one is an error, not a wild read. Blocks
    // before the first query's window are never read (a freed one may hold anything).
    const int64_t first_block =
        window > 0 ? std::max<int64_t>(0, first_pos + 1 - window) / block_size : 0;
    for (int64_t b = first_block; b < blocks; ++b) {
      const int32_t id = a.tables[s * a.table_stride + b];
      TORCH_CHECK(id >= 0 && id < key_cache.size(0), "sequence ", s, ": block id ", id,
                  " is outside the cache's ", key_cache.size(0), " blocks");
    }
    for (int64_t b = 0; b < q_len; b += kChunkTokens) {
      const int64_t e = std::min(q_len, b + kChunkTokens);
      const int64_t keys = window > 0 ? std::min<int64_t>(first_pos + e, window + e - b)
                                      : first_pos + e;
      items.push_back({s, static_cast<int32_t>(b), static_cast<int32_t>(e), 0,
                       static_cast<int32_t>(heads), (e - b) * heads * keys});
      total_cost += items.back().cost;
    }
  }
  if (items.empty()) return;
  // Waking the other threads costs a few microseconds (far more when their cores are busy
  // elsewhere): small calls (few sequences, short contexts) run on this one.
  const int64_t threads = total_cost >= kParallelCost ? at::get_num_threads() : 1;
  // Fewer items than threads (one long decode): split decodes by query heads. A row's
  // arithmetic does not depend on which rows share its item (group_scores), so no bits
  // change.
  const int64_t parts = (threads + static_cast<int64_t>(items.size()) - 1) /
                        static_cast<int64_t>(items.size());
  if (parts > 1) {
    std::vector<Item> split;
    for (const Item& item : items) {
      const int64_t n = item.q_end - item.q_begin == 1 ? std::min(parts, heads) : 1;
      for (int64_t i = 0; i < n; ++i) {
        Item part = item;
        part.h_begin = static_cast<int32_t>(heads * i / n);
        part.h_end = static_cast<int32_t>(heads * (i + 1) / n);
        part.cost = item.cost * (part.h_end - part.h_begin) / heads;
        split.push_back(part);
      }
    }
    items.swap(split);
  }
  // Longest first, handed out one at a time: uneven items still balance across threads.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.cost > y.cost; });
  auto launch = [&](auto tag, auto cache_tag, auto fixed_dim) {
    using T = decltype(tag);
    using C = decltype(cache_tag);
    constexpr int kD = decltype(fixed_dim)::value;
    const Rows<const T> q{query.data_ptr<T>(), query.stride(0), query.stride(1)};
    const Rows<T> o{out.data_ptr<T>(), out.stride(0), out.stride(1)};
    const C* kc = static_cast<const C*>(key_cache.data_ptr());
    const C* vc = static_cast<const C*>(value_cache.data_ptr());
    const int64_t n_items = static_cast<int64_t>(items.size());
    std::atomic<int64_t> next{0};
    at::parallel_for(0, std::min(threads, n_items), 1,
                     [&](int64_t, int64_t) {
                       std::vector<float> buffer;
                       for (int64_t i = next++; i < n_items; i = next++)
                         run_item<T, C, kD>(items[i], a, q, kc, vc, o, buffer);
                     });
  };
  auto by_dim = [&](auto tag, auto cache_tag) {
    switch (head_dim) {
      case 64: return launch(tag, cache_tag, std::integral_constant<int, 64>{});
      case 128: return launch(tag, cache_tag, std::integral_constant<int, 128>{});
      case 32: return launch(tag, cache_tag, std::integral_constant<int, 32>{});
      case 96: return launch(tag, cache_tag, std::integral_constant<int, 96>{});
      default: return launch(tag, cache_tag, std::integral_constant<int, 0>{});
    }
  };
  auto by_cache = [&](auto tag) {
    using T = decltype(tag);
    switch (cache_dtype) {
      case at::kChar: return by_dim(tag, int8_t{});
      case at::kFloat8_e4m3fn: return by_dim(tag, c10::Float8_e4m3fn{});
      case at::kFloat8_e5m2: return by_dim(tag, c10::Float8_e5m2{});
      case at::kBFloat16: return by_dim(tag, c10::BFloat16{});
      default:
        if constexpr (std::is_same_v<T, float>) return by_dim(tag, float{});
    }
  };
  if (dtype == at::kFloat) by_cache(float{});
  else by_cache(c10::BFloat16{});
}

void paged_attention(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& block_tables_in,
                     const at::Tensor& seq_lens_in, const at::Tensor& query_start_loc_in,
                     double scale, int64_t window, double softcap) {
  attend(out, query, key_cache, value_cache, block_tables_in, seq_lens_in, query_start_loc_in,
         scale, window, softcap, nullptr);
}

// gpt-oss: sinks [heads] float32, one more logit per head in each row's softmax denominator.
// Its own op, so paged_attention's schema (which decode_step.cpp calls) stays as it is.
void paged_attention_sinks(const at::Tensor& out, const at::Tensor& query,
                           const at::Tensor& key_cache, const at::Tensor& value_cache,
                           const at::Tensor& block_tables_in, const at::Tensor& seq_lens_in,
                           const at::Tensor& query_start_loc_in, double scale, int64_t window,
                           double softcap, const at::Tensor& sinks) {
  TORCH_CHECK(sinks.device().is_cpu() && sinks.scalar_type() == at::kFloat && sinks.dim() == 1 &&
                  sinks.size(0) == query.size(1) && sinks.is_contiguous(),
              "sinks must be a contiguous float32 CPU tensor of [heads=", query.size(1),
              "], got ", sinks.sizes());
  attend(out, query, key_cache, value_cache, block_tables_in, seq_lens_in, query_start_loc_in,
         scale, window, softcap, sinks.data_ptr<float>());
}

}  // namespace

TORCH_LIBRARY(folio, m) {
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, float scale, "
        "int window=0, float softcap=0.0) -> ()");
  m.def("paged_attention_sinks(Tensor(a!) out, Tensor query, Tensor key_cache, "
        "Tensor value_cache, Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, "
        "float scale, int window, float softcap, Tensor sinks) -> ()");
}

TORCH_LIBRARY_IMPL(folio, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("paged_attention_sinks", &paged_attention_sinks);
}

#include "backends/model/causal_lm.hpp"

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/hf_checkpoint.hpp"
#include "backends/model/init.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;

namespace {

model_config llama_tied() {
  auto c = preset("tiny");
  c.vocab_size = 96;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 64;
  return c;
}

model_config qwen2_biased() {
  auto c = preset("tiny-qwen2");
  c.vocab_size = 96;
  c.max_position_embeddings = 64;
  c.rope_theta = 1000000.0;
  return c;
}

model_config qwen3_wide_heads() {
  auto c = preset("tiny-qwen3");
  c.vocab_size = 96;
  c.head_dim = 24; // != hidden_size / num_attention_heads = 16
  c.max_position_embeddings = 64;
  return c;
}

// Weights with enough spread that the logits are far from uniform, norm weights away from 1 and
// non-zero biases, so every term of the architecture shows up in the outputs.
std::map<std::string, at::Tensor> spread_weights(const model_config& c, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::map<std::string, at::Tensor> out;
  for (auto& [name, shape] : expected_weight_shapes(c)) {
    auto t = at::empty(shape, at::kFloat);
    bool norm = name.find("norm") != std::string::npos;
    bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (norm)
      t.uniform_(0.5, 1.5, gen);
    else if (bias)
      t.normal_(0.0, 0.3, gen);
    else
      t.normal_(0.0, 0.15, gen);
    out[name] = t;
  }
  return out;
}

// ---- independent reference, written with explicit loops in double precision ----------------

std::vector<double> manual_rms(const std::vector<double>& x, const at::Tensor& w, double eps) {
  double ms = 0;
  for (double v : x)
    ms += v * v;
  ms /= static_cast<double>(x.size());
  double inv = 1.0 / std::sqrt(ms + eps);
  auto wa = w.accessor<double, 1>();
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = x[i] * inv * wa[static_cast<int64_t>(i)];
  return out;
}

// y = W x + b for W [out, in].
std::vector<double> manual_linear(const std::vector<double>& x, const at::Tensor& w,
                                  const at::Tensor* b) {
  auto wa = w.accessor<double, 2>();
  std::vector<double> y(static_cast<size_t>(w.size(0)));
  for (int64_t o = 0; o < w.size(0); ++o) {
    double s = b ? b->accessor<double, 1>()[o] : 0.0;
    for (int64_t i = 0; i < w.size(1); ++i)
      s += wa[o][i] * x[static_cast<size_t>(i)];
    y[static_cast<size_t>(o)] = s;
  }
  return y;
}

// Rotary frequency i of head width d, with HF's "linear" and "llama3" rope scaling written out
// per frequency.
double reference_freq(const model_config& c, int64_t i) {
  double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
  if (c.rope_scaling.is_null())
    return f;
  auto& rs = c.rope_scaling;
  double factor = rs.at("factor").get<double>();
  if (rs.at("rope_type") == "linear")
    return f / factor;
  double low = rs.at("low_freq_factor").get<double>();
  double high = rs.at("high_freq_factor").get<double>();
  double old_len = rs.at("original_max_position_embeddings").get<double>();
  double wavelen = 2 * M_PI / f;
  if (wavelen < old_len / high)
    return f; // high frequency: unchanged
  if (wavelen > old_len / low)
    return f / factor; // low frequency: fully scaled
  double smooth = (old_len / wavelen - low) / (high - low);
  return (1 - smooth) * f / factor + smooth * f;
}

// Rotary embedding of one head vector at position `pos` by explicit angles: pairs (i, i + d/2).
void manual_rotary(double* v, int64_t d, int64_t pos, const model_config& c) {
  for (int64_t i = 0; i < d / 2; ++i) {
    double angle = static_cast<double>(pos) * reference_freq(c, i);
    double a = v[i], b = v[i + d / 2];
    v[i] = a * std::cos(angle) - b * std::sin(angle);
    v[i + d / 2] = b * std::cos(angle) + a * std::sin(angle);
  }
}

// Log-probs of tokens[t+1] given tokens[0..t] for one unpadded sequence.
std::vector<double> reference_logprobs(const model_config& c,
                                       const std::map<std::string, at::Tensor>& weights_f,
                                       const std::vector<int64_t>& tokens) {
  std::map<std::string, at::Tensor> w;
  for (auto& [n, t] : weights_f)
    w[n] = t.to(at::kDouble).contiguous();
  auto has = [&](const std::string& n) { return w.count(n) > 0; };
  const int64_t t_len = static_cast<int64_t>(tokens.size());
  const int64_t d = c.head_dim, heads = c.num_attention_heads, kvh = c.num_key_value_heads;
  const int64_t hid = c.hidden_size;
  std::vector<std::vector<double>> x(static_cast<size_t>(t_len));
  auto emb = w.at("model.embed_tokens.weight").accessor<double, 2>();
  for (int64_t t = 0; t < t_len; ++t)
    for (int64_t i = 0; i < hid; ++i)
      x[static_cast<size_t>(t)].push_back(emb[tokens[static_cast<size_t>(t)]][i]);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto p = "model.layers." + std::to_string(l) + ".";
    auto lin = [&](const std::vector<double>& in, const std::string& name) {
      auto bias = p + name + ".bias";
      return manual_linear(in, w.at(p + name + ".weight"), has(bias) ? &w.at(bias) : nullptr);
    };
    std::vector<std::vector<double>> q(x.size()), k(x.size()), v(x.size());
    for (int64_t t = 0; t < t_len; ++t) {
      auto h = manual_rms(x[static_cast<size_t>(t)], w.at(p + "input_layernorm.weight"),
                          c.rms_norm_eps);
      q[t] = lin(h, "self_attn.q_proj");
      k[t] = lin(h, "self_attn.k_proj");
      v[t] = lin(h, "self_attn.v_proj");
      for (int64_t hh = 0; hh < heads; ++hh) {
        double* qh = q[t].data() + hh * d;
        if (has(p + "self_attn.q_norm.weight")) {
          auto n = manual_rms(std::vector<double>(qh, qh + d), w.at(p + "self_attn.q_norm.weight"),
                              c.rms_norm_eps);
          std::copy(n.begin(), n.end(), qh);
        }
        manual_rotary(qh, d, t, c);
      }
      for (int64_t hh = 0; hh < kvh; ++hh) {
        double* kh = k[t].data() + hh * d;
        if (has(p + "self_attn.k_norm.weight")) {
          auto n = manual_rms(std::vector<double>(kh, kh + d), w.at(p + "self_attn.k_norm.weight"),
                              c.rms_norm_eps);
          std::copy(n.begin(), n.end(), kh);
        }
        manual_rotary(kh, d, t, c);
      }
    }
    for (int64_t t = 0; t < t_len; ++t) {
      std::vector<double> attn(static_cast<size_t>(heads * d), 0.0);
      for (int64_t hh = 0; hh < heads; ++hh) {
        int64_t g = hh / (heads / kvh); // the kv head this query head reads
        std::vector<double> s(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i)
            dot += q[t][hh * d + i] * k[j][g * d + i];
          s[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s)
          z += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < d; ++i)
            attn[hh * d + i] += s[j] / z * v[j][g * d + i];
      }
      auto o = lin(attn, "self_attn.o_proj");
      for (int64_t i = 0; i < hid; ++i)
        x[t][i] += o[i];
      auto h = manual_rms(x[t], w.at(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
      auto gate = lin(h, "mlp.gate_proj");
      auto up = lin(h, "mlp.up_proj");
      for (size_t i = 0; i < gate.size(); ++i)
        gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      auto down = lin(gate, "mlp.down_proj");
      for (int64_t i = 0; i < hid; ++i)
        x[t][i] += down[i];
    }
  }
  const auto& head = c.tie_word_embeddings ? w.at("model.embed_tokens.weight") : w.at("lm_head.weight");
  std::vector<double> out;
  for (int64_t t = 0; t + 1 < t_len; ++t) {
    auto h = manual_rms(x[t], w.at("model.norm.weight"), c.rms_norm_eps);
    auto logits = manual_linear(h, head, nullptr);
    double mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (double e : logits)
      z += std::exp(e - mx);
    out.push_back(logits[tokens[t + 1]] - mx - std::log(z));
  }
  return out;
}

std::vector<double> expect_matches_reference(const model_config& c,
                                             std::vector<int64_t> tokens = {3, 17, 95, 0, 42, 42,
                                                                            8, 61, 29, 5}) {
  auto weights = spread_weights(c, 7);
  auto model = causal_lm::from_weights(c, weights);
  auto expected = reference_logprobs(c, weights, tokens);
  auto got = score_tokens(*model, tokens);
  EXPECT_EQ(got.size(), expected.size());
  if (got.size() != expected.size())
    return got;
  double spread = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], 1e-4) << "position " << i;
    spread = std::max(spread, std::abs(expected[i] + std::log(96.0)));
  }
  // The weights are spread enough that the distribution is far from uniform.
  EXPECT_GT(spread, 0.5);
  return got;
}

at::Tensor full_logits(causal_lm& m, const at::Tensor& ids) {
  c10::NoGradGuard ng;
  return m.logits(m.forward_hidden(ids));
}

} // namespace

TEST(CausalLm, LlamaWithTiedEmbeddingsMatchesIndependentReference) {
  expect_matches_reference(llama_tied());
}

TEST(CausalLm, Qwen2WithBiasesMatchesIndependentReference) {
  auto c = qwen2_biased();
  ASSERT_TRUE(c.attention_bias);
  expect_matches_reference(c);
}

TEST(CausalLm, Qwen3WithQkNormAndWideHeadDimMatchesIndependentReference) {
  auto c = qwen3_wide_heads();
  ASSERT_NE(c.head_dim * c.num_attention_heads, c.hidden_size);
  expect_matches_reference(c);
}

TEST(CausalLm, IncrementalDecodingWithKvCacheMatchesFullForward) {
  for (auto c : {llama_tied(), qwen2_biased(), qwen3_wide_heads()}) {
    auto model = causal_lm::from_weights(c, spread_weights(c, 11));
    auto ids = at::tensor({5, 9, 33, 70, 2, 2, 81, 14, 60}, at::kLong).view({1, -1});
    auto full = full_logits(*model, ids);
    c10::NoGradGuard ng;
    kv_cache cache;
    const int64_t prefill = 4;
    auto mask = at::ones({1, prefill}, at::kLong);
    auto pos = at::arange(prefill, at::kLong).view({1, -1});
    auto h = model->forward_hidden(ids.narrow(1, 0, prefill), mask, pos, &cache);
    EXPECT_EQ(cache.length(), prefill);
    EXPECT_TRUE(at::allclose(model->logits(h), full.narrow(1, 0, prefill), 0, 1e-5));
    for (int64_t t = prefill; t < ids.size(1); ++t) {
      mask = at::ones({1, t + 1}, at::kLong);
      pos = at::full({1, 1}, t, at::kLong);
      h = model->forward_hidden(ids.narrow(1, t, 1), mask, pos, &cache);
      EXPECT_EQ(cache.length(), t + 1);
      auto diff = (model->logits(h) - full.narrow(1, t, 1)).abs().max().item<double>();
      EXPECT_LT(diff, 1e-5) << to_string(c.arch) << " step " << t;
    }
  }
}

TEST(CausalLm, LeftPaddedRowsMatchUnpaddedSingleRows) {
  auto c = qwen3_wide_heads();
  auto model = causal_lm::from_weights(c, spread_weights(c, 3));
  std::vector<std::vector<int64_t>> rows{{4, 8, 15, 16, 23, 42}, {7, 1, 90}, {55, 12, 13, 14}};
  const int64_t s = 6, pad_id = 0;
  auto ids = at::full({3, s}, pad_id, at::kLong);
  auto mask = at::zeros({3, s}, at::kLong);
  for (int64_t r = 0; r < 3; ++r) {
    auto n = static_cast<int64_t>(rows[r].size());
    for (int64_t i = 0; i < n; ++i) {
      ids[r][s - n + i] = rows[r][i];
      mask[r][s - n + i] = 1;
    }
  }
  auto pos = (mask.cumsum(1) - 1).clamp_min(0);
  c10::NoGradGuard ng;
  // Prefill all but the last token of each row, then decode the last one through the cache.
  kv_cache cache;
  auto h_pre = model->forward_hidden(ids.narrow(1, 0, s - 1), mask.narrow(1, 0, s - 1),
                                     pos.narrow(1, 0, s - 1), &cache);
  auto h_last = model->forward_hidden(ids.narrow(1, s - 1, 1), mask, pos.narrow(1, s - 1, 1), &cache);
  auto batched = model->logits(at::cat({h_pre, h_last}, 1));
  EXPECT_FALSE(at::isnan(batched).any().item<bool>());
  for (int64_t r = 0; r < 3; ++r) {
    auto n = static_cast<int64_t>(rows[r].size());
    auto alone = full_logits(*model, at::tensor(rows[r], at::kLong).view({1, -1}));
    auto diff = (batched[r].narrow(0, s - n, n) - alone[0]).abs().max().item<double>();
    EXPECT_LT(diff, 1e-5) << "row " << r;
  }
}

TEST(CausalLm, PaddingTokensNeverInfluenceRealPositions) {
  auto c = llama_tied();
  auto model = causal_lm::from_weights(c, spread_weights(c, 5));
  auto mask = at::tensor({0, 0, 0, 1, 1, 1}, at::kLong).view({1, -1});
  auto pos = (mask.cumsum(1) - 1).clamp_min(0);
  c10::NoGradGuard ng;
  auto a = model->logits(model->forward_hidden(at::tensor({1, 2, 3, 40, 41, 42}, at::kLong).view({1, -1}), mask, pos));
  auto b = model->logits(model->forward_hidden(at::tensor({90, 60, 30, 40, 41, 42}, at::kLong).view({1, -1}), mask, pos));
  EXPECT_TRUE(at::equal(a.narrow(1, 3, 3), b.narrow(1, 3, 3)));
  EXPECT_FALSE(at::isnan(a).any().item<bool>());
}

TEST(CausalLm, ExportReloadsIdentically) {
  for (auto c : {llama_tied(), qwen2_biased(), qwen3_wide_heads()}) {
    auto model = causal_lm::from_weights(c, spread_weights(c, 9));
    temp_dir dir("export");
    model->save_hf(dir.str());
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "config.json"));
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "model.safetensors"));
    auto reloaded = causal_lm::load(dir.str());
    EXPECT_EQ(reloaded->config(), c);
    auto a = model->state_dict();
    auto b = reloaded->state_dict();
    ASSERT_EQ(a.size(), b.size());
    for (auto& [name, t] : a) {
      ASSERT_TRUE(b.count(name)) << name;
      EXPECT_TRUE(at::equal(t, b.at(name))) << name;
    }
    EXPECT_EQ(a.count("lm_head.weight"), c.tie_word_embeddings ? 0u : 1u);
    auto ids = at::tensor({1, 2, 3, 4, 5}, at::kLong).view({1, -1});
    EXPECT_TRUE(at::equal(full_logits(*model, ids), full_logits(*reloaded, ids)));
  }
}

TEST(CausalLm, HalfPrecisionCheckpointsLoadUpcastToFp32) {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    auto c = qwen2_biased();
    auto weights = spread_weights(c, 21);
    std::map<std::string, at::Tensor> half;
    for (auto& [n, t] : weights)
      half[n] = t.to(dtype);
    c.torch_dtype = dtype == at::kBFloat16 ? "bfloat16" : "float16";
    temp_dir dir(dtype == at::kBFloat16 ? "bf16" : "f16");
    save_hf_checkpoint(dir.str(), c, half);
    auto model = causal_lm::load(dir.str());
    EXPECT_EQ(model->config().torch_dtype, c.torch_dtype);
    for (auto& [name, t] : model->named_parameters()) {
      EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
      EXPECT_TRUE(at::equal(t, half.at(name).to(at::kFloat))) << name;
    }
    // Re-exported in fp32, and config.json says so.
    temp_dir out(dtype == at::kBFloat16 ? "bf16_out" : "f16_out");
    model->save_hf(out.str());
    EXPECT_EQ(load_model_config(out.str()).torch_dtype, "float32");
    EXPECT_TRUE(at::equal(causal_lm::load(out.str())->lm_head_weight(), model->lm_head_weight()));
  }
}

TEST(CausalLm, RandomInitIsDeterministicAndHfLike) {
  auto c = preset("tiny-qwen3");
  auto a = causal_lm::random(c, 42);
  auto b = causal_lm::random(c, 42);
  auto other = causal_lm::random(c, 43);
  auto sa = a->state_dict(), sb = b->state_dict(), so = other->state_dict();
  EXPECT_EQ(sa.size(), expected_weight_names(c).size());
  for (auto& [name, t] : sa) {
    EXPECT_TRUE(at::equal(t, sb.at(name))) << name;
    if (name.find("norm") != std::string::npos) {
      EXPECT_TRUE(at::equal(t, at::ones_like(t))) << name;
    } else {
      EXPECT_FALSE(at::equal(t, so.at(name))) << name;
      if (t.numel() > 1000) {
        EXPECT_NEAR(t.std().item<double>(), 0.02, 0.002) << name;
      }
    }
  }
  EXPECT_EQ(a->num_parameters(), num_parameters(c));
  for (auto& [name, t] : a->named_parameters())
    EXPECT_TRUE(t.requires_grad()) << name;
}

TEST(CausalLm, GradientsReachEveryParameter) {
  auto c = qwen2_biased();
  auto model = causal_lm::from_weights(c, spread_weights(c, 1));
  auto ids = at::tensor({3, 1, 4, 1, 5, 9, 2, 6}, at::kLong).view({2, 4});
  auto r = sequence_logprobs(*model, ids, at::ones_like(ids));
  (-r.logprobs.sum()).backward();
  for (auto& [name, t] : model->named_parameters()) {
    ASSERT_TRUE(t.grad().defined()) << name;
    EXPECT_GT(t.grad().abs().sum().item<double>(), 0) << name;
  }
}

TEST(CausalLm, ValueHeadGivesOneValuePerToken) {
  auto c = llama_tied();
  auto model = causal_lm::from_weights(c, spread_weights(c, 2));
  EXPECT_FALSE(model->has_value_head());
  auto ids = at::tensor({3, 1, 4, 1, 5, 9}, at::kLong).view({2, 3});
  c10::NoGradGuard ng;
  auto h = model->forward_hidden(ids);
  expect_error([&] { model->values(h); }, error_code::invalid_argument, {"value head"});
  model->add_value_head(5);
  auto v = model->values(h);
  ASSERT_EQ(v.sizes(), (at::IntArrayRef{2, 3}));
  auto sd = model->state_dict();
  auto w = sd.at("value_head.weight");
  EXPECT_EQ(w.sizes(), (at::IntArrayRef{1, c.hidden_size}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      EXPECT_NEAR(v[b][t].item<double>(), (h[b][t] * w[0]).sum().item<double>(), 1e-5);
  // The value head survives an export/reload.
  temp_dir dir("value_head");
  model->save_hf(dir.str());
  auto reloaded = causal_lm::load(dir.str());
  ASSERT_TRUE(reloaded->has_value_head());
  EXPECT_TRUE(at::equal(reloaded->values(h), v));
}

TEST(CausalLm, KvCacheReorderKeepsSelectedRows) {
  auto c = llama_tied();
  auto model = causal_lm::from_weights(c, spread_weights(c, 4));
  auto ids = at::tensor({1, 2, 3, 4, 5, 6, 7, 8, 9}, at::kLong).view({3, 3});
  c10::NoGradGuard ng;
  kv_cache cache;
  model->forward_hidden(ids, at::ones({3, 3}, at::kLong),
                        at::arange(3, at::kLong).repeat({3, 1}), &cache);
  auto keys_row2 = cache.keys[0][2].clone();
  cache.reorder_or_select(at::tensor({2, 0}, at::kLong));
  EXPECT_EQ(cache.batch_size(), 2);
  EXPECT_TRUE(at::equal(cache.keys[0][0], keys_row2));
  // Decoding continues for the kept rows and equals their full forward.
  auto next = at::tensor({10, 11}, at::kLong).view({2, 1});
  auto h = model->forward_hidden(next, at::ones({2, 4}, at::kLong), at::full({2, 1}, 3, at::kLong), &cache);
  auto full = full_logits(*model, at::tensor({7, 8, 9, 10}, at::kLong).view({1, 4}));
  EXPECT_LT((model->logits(h)[0][0] - full[0][3]).abs().max().item<double>(), 1e-5);
  expect_error([&] { cache.reorder_or_select(at::tensor({5}, at::kLong)); }, error_code::out_of_range,
               {"5"});
}

TEST(CausalLm, RejectsUnknownArchitecture) {
  expect_error([] { parse_architecture("GPT2LMHeadModel"); }, error_code::unsupported, {"GPT2LMHeadModel"});
  temp_dir dir("unknown_arch");
  auto j = to_json(llama_tied());
  j["architectures"] = {"MambaForCausalLM"};
  j["model_type"] = "mamba";
  std::ofstream(dir.path() / "config.json") << j.dump();
  expect_error([&] { causal_lm::load(dir.str()); }, error_code::unsupported, {"MambaForCausalLM"});
}

TEST(CausalLm, RejectsWeightShapeDisagreeingWithConfig) {
  auto c = qwen2_biased();
  auto w = spread_weights(c, 1);
  w["model.layers.1.self_attn.k_proj.weight"] = at::zeros({7, c.hidden_size});
  expect_error([&] { causal_lm::from_weights(c, w); }, error_code::invalid_argument,
               {"model.layers.1.self_attn.k_proj.weight", "[32, 64]", "[7, 64]"});
  auto missing = spread_weights(c, 1);
  missing.erase("model.layers.0.mlp.up_proj.weight");
  expect_error([&] { causal_lm::from_weights(c, missing); }, error_code::invalid_argument,
               {"model.layers.0.mlp.up_proj.weight"});
  auto vh = spread_weights(c, 1);
  vh["value_head.weight"] = at::zeros({2, c.hidden_size});
  expect_error([&] { causal_lm::from_weights(c, vh); }, error_code::invalid_argument,
               {"value_head.weight", "[2, 64]"});
}

TEST(CausalLm, RejectsTokenIdsOutsideTheVocabulary) {
  auto c = llama_tied();
  auto model = causal_lm::random(c, 1);
  for (int64_t bad : {int64_t{96}, int64_t{-1}, int64_t{100000}}) {
    auto ids = at::tensor(std::vector<int64_t>{1, bad, 2}, at::kLong).view({1, 3});
    expect_error([&] { model->forward_hidden(ids); }, error_code::out_of_range,
                 {std::to_string(bad), "96"});
  }
}

TEST(CausalLm, RejectsPromptLongerThanMaxPositionEmbeddings) {
  auto c = llama_tied();
  auto model = causal_lm::random(c, 1);
  auto ids = at::ones({1, 65}, at::kLong);
  expect_error([&] { model->forward_hidden(ids); }, error_code::invalid_argument, {"65", "64"});
  // Also through the cache: 60 past + 5 new > 64.
  c10::NoGradGuard ng;
  kv_cache cache;
  model->forward_hidden(at::ones({1, 60}, at::kLong), at::ones({1, 60}, at::kLong),
                        at::arange(60, at::kLong).view({1, -1}), &cache);
  expect_error([&] {
    model->forward_hidden(at::ones({1, 5}, at::kLong), at::ones({1, 65}, at::kLong),
                          at::arange(60, 65, at::kLong).view({1, -1}), &cache);
  }, error_code::invalid_argument, {"65", "64"});
}

TEST(CausalLm, RejectsMalformedInputs) {
  auto c = llama_tied();
  auto model = causal_lm::random(c, 1);
  auto ids = at::ones({2, 3}, at::kLong);
  auto mask = at::ones({2, 3}, at::kLong);
  auto pos = at::arange(3, at::kLong).repeat({2, 1});
  expect_error([&] { model->forward_hidden(at::ones({3}, at::kLong)); }, error_code::invalid_argument, {"[3]"});
  expect_error([&] { model->forward_hidden(at::ones({2, 3}, at::kFloat), mask, pos); },
               error_code::invalid_argument, {"integer"});
  expect_error([&] { model->forward_hidden(ids, at::ones({2, 4}, at::kLong), pos); },
               error_code::invalid_argument, {"attention_mask", "[2, 4]"});
  expect_error([&] { model->forward_hidden(ids, mask, at::zeros({2, 2}, at::kLong)); },
               error_code::invalid_argument, {"position_ids", "[2, 2]"});
  expect_error([&] { model->forward_hidden(ids, mask, pos - 5); }, error_code::out_of_range,
               {"position id", "-5"});
  c10::NoGradGuard ng;
  kv_cache cache;
  model->forward_hidden(ids, mask, pos, &cache);
  expect_error([&] {
    model->forward_hidden(at::ones({1, 1}, at::kLong), at::ones({1, 4}, at::kLong),
                          at::full({1, 1}, 3, at::kLong), &cache);
  }, error_code::invalid_argument, {"kv_cache", "2", "1"});
  expect_error([&] { model->logits(at::zeros({2, 5})); }, error_code::invalid_argument, {"[2, 5]"});
  expect_error([] { causal_lm::load("/nonexistent/rlforge-model"); }, error_code::not_found,
               {"/nonexistent/rlforge-model"});
}

TEST(CausalLm, RejectsInvalidConfigsAndInitSettings) {
  auto c = llama_tied();
  c.num_key_value_heads = 3; // does not divide 4 heads
  expect_error([&] { causal_lm::random(c, 1); }, error_code::invalid_argument,
               {"num_key_value_heads"});
  for (double std : {0.0, -0.5, std::nan("")})
    expect_error([&] { random_hf_weights(llama_tied(), 1, std); }, error_code::invalid_argument,
                 {"std"});
  auto model = causal_lm::random(llama_tied(), 1);
  model->add_value_head(1);
  expect_error([&] { model->values(at::zeros({2, 3, 10})); }, error_code::invalid_argument,
               {"[2, 3, 10]"});
  expect_error([&] { model->values(at::zeros({2, 64})); }, error_code::invalid_argument,
               {"[2, 64]"});
}

TEST(CausalLm, FromWeightsNeverAliasesTheCallersTensors) {
  auto c = llama_tied();
  auto weights = spread_weights(c, 8);
  auto model = causal_lm::from_weights(c, weights);
  auto ids = at::tensor({4, 5, 6}, at::kLong).view({1, 3});
  auto before = full_logits(*model, ids);
  for (auto& [name, t] : weights)
    t.zero_();
  EXPECT_TRUE(at::equal(full_logits(*model, ids), before));
}

TEST(CausalLm, RopeScalingLinearAndLlama3MatchIndependentReference) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 48; ++i)
    tokens.push_back((i * 37 + 11) % 96);
  auto plain = llama_tied();
  auto unscaled = expect_matches_reference(plain, tokens);
  auto llama3 = plain;
  // head_dim 16, theta 1e4: wavelengths 6.3 ... 19869, so with an original context of 512 the
  // frequencies fall in all three bands (kept, smoothed, divided by the factor).
  llama3.rope_scaling = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 512}};
  auto scaled = expect_matches_reference(llama3, tokens);
  auto linear = plain;
  linear.rope_scaling = {{"rope_type", "linear"}, {"factor", 4.0}};
  auto lin = expect_matches_reference(linear, tokens);
  double d_scaled = 0, d_lin = 0;
  for (size_t i = 0; i < unscaled.size(); ++i) {
    d_scaled = std::max(d_scaled, std::abs(scaled[i] - unscaled[i]));
    d_lin = std::max(d_lin, std::abs(lin[i] - unscaled[i]));
  }
  EXPECT_GT(d_scaled, 1e-3); // the scaling is really applied
  EXPECT_GT(d_lin, 1e-3);
}

TEST(CausalLm, RejectsUnsupportedRopeScaling) {
  auto c = llama_tied();
  c.rope_scaling = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { causal_lm::random(c, 1); }, error_code::unsupported, {"yarn"});
  c.rope_scaling = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error([&] { causal_lm::random(c, 1); }, error_code::invalid_argument,
               {"low_freq_factor"});
  c.rope_scaling = {{"rope_type", 3}, {"factor", 8.0}};
  expect_error([&] { causal_lm::random(c, 1); }, error_code::invalid_argument, {"3"});
  c.rope_scaling = {{"type", "linear"}, {"factor", -2.0}};
  expect_error([&] { causal_lm::random(c, 1); }, error_code::invalid_argument, {"-2"});
}

namespace {

// The model written a second time with plain autograd ops (keys/values repeated per query head,
// rotate_half by concatenation, masked softmax), to check the model's hand-written backward.
at::Tensor autograd_reference_hidden(const model_config& c, std::map<std::string, at::Tensor>& w,
                                     const at::Tensor& ids, const at::Tensor& mask) {
  auto rms = [&](const at::Tensor& x, const at::Tensor& g) {
    return g * x / at::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps);
  };
  auto lin = [&](const at::Tensor& x, const std::string& n) {
    auto b = w.count(n + ".bias") ? w.at(n + ".bias") : at::Tensor();
    return at::matmul(x, w.at(n + ".weight").t()) + (b.defined() ? b : at::zeros({1}));
  };
  const int64_t bsz = ids.size(0), t = ids.size(1), d = c.head_dim;
  auto pos = (mask.cumsum(1) - 1).clamp_min(0).to(at::kDouble);
  auto idx = at::arange(d / 2, at::kDouble);
  auto freq = at::pow(c.rope_theta, -2.0 * idx / static_cast<double>(d));
  auto ang = (pos.unsqueeze(-1) * freq).to(at::kFloat);            // [B, T, d/2]
  auto cos = at::cat({ang.cos(), ang.cos()}, -1).unsqueeze(1);     // [B, 1, T, d]
  auto sin = at::cat({ang.sin(), ang.sin()}, -1).unsqueeze(1);
  auto rot = [&](const at::Tensor& x) {
    auto x1 = x.narrow(-1, 0, d / 2), x2 = x.narrow(-1, d / 2, d / 2);
    return x * cos + at::cat({-x2, x1}, -1) * sin;
  };
  auto causal = at::ones({t, t}, at::kBool).tril();
  auto self = at::eye(t, at::kBool);
  auto allowed = causal.unsqueeze(0) & (mask.to(at::kBool).unsqueeze(1) | self.unsqueeze(0));
  auto x = w.at("model.embed_tokens.weight").index_select(0, ids.reshape({-1})).view({bsz, t, -1});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto p = "model.layers." + std::to_string(l) + ".";
    auto h = rms(x, w.at(p + "input_layernorm.weight"));
    auto q = lin(h, p + "self_attn.q_proj").view({bsz, t, -1, d});
    auto k = lin(h, p + "self_attn.k_proj").view({bsz, t, -1, d});
    auto v = lin(h, p + "self_attn.v_proj").view({bsz, t, -1, d}).transpose(1, 2);
    if (w.count(p + "self_attn.q_norm.weight")) {
      q = rms(q, w.at(p + "self_attn.q_norm.weight"));
      k = rms(k, w.at(p + "self_attn.k_norm.weight"));
    }
    q = rot(q.transpose(1, 2));
    k = rot(k.transpose(1, 2));
    auto rep = c.num_attention_heads / c.num_key_value_heads;
    k = k.repeat_interleave(rep, 1);
    v = v.repeat_interleave(rep, 1);
    auto scores = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
    scores = scores.masked_fill(allowed.logical_not().unsqueeze(1), -1e30);
    auto o = at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({bsz, t, -1});
    x = x + lin(o, p + "self_attn.o_proj");
    h = rms(x, w.at(p + "post_attention_layernorm.weight"));
    auto g = lin(h, p + "mlp.gate_proj");
    x = x + lin(g * at::sigmoid(g) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj");
  }
  return rms(x, w.at("model.norm.weight"));
}

} // namespace

TEST(CausalLm, GradientsMatchAnIndependentAutogradImplementation) {
  for (auto c : {qwen2_biased(), qwen3_wide_heads()}) {
    auto model = causal_lm::from_weights(c, spread_weights(c, 12));
    auto ids = at::tensor({0, 0, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, at::kLong).view({2, 6});
    auto mask = at::tensor({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, at::kLong).view({2, 6});
    auto lp = sequence_logprobs(*model, ids, mask).logprobs;
    auto target_mask = mask.narrow(1, 1, 5).to(at::kFloat);
    (lp * target_mask).sum().backward();

    std::map<std::string, at::Tensor> w;
    for (auto& [name, t] : model->named_parameters())
      w[name] = t.detach().clone().requires_grad_(true);
    auto h = autograd_reference_hidden(c, w, ids, mask);
    const auto& head = c.tie_word_embeddings ? w.at("model.embed_tokens.weight") : w.at("lm_head.weight");
    auto logp = at::log_softmax(at::matmul(h.narrow(1, 0, 5), head.t()), -1);
    auto ref_lp = logp.gather(-1, ids.narrow(1, 1, 5).unsqueeze(-1)).squeeze(-1);
    EXPECT_LT(((ref_lp - lp) * target_mask).abs().max().item<double>(), 1e-4);
    (ref_lp * target_mask).sum().backward();
    for (auto& [name, t] : model->named_parameters()) {
      auto ref = w.at(name).grad();
      ASSERT_TRUE(ref.defined()) << name;
      auto err = (t.grad() - ref).abs().max().item<double>();
      auto scale = ref.abs().max().item<double>();
      EXPECT_LT(err, 1e-4 * std::max(1.0, scale)) << to_string(c.arch) << " " << name;
    }
  }
}

TEST(CausalLm, ForwardWorksUnderInferenceMode) {
  auto c = qwen3_wide_heads();
  auto model = causal_lm::from_weights(c, spread_weights(c, 6));
  auto ids = at::tensor({9, 8, 7, 6}, at::kLong).view({1, 4});
  auto expected = full_logits(*model, ids);
  c10::InferenceMode guard;
  kv_cache cache;
  auto h = model->forward_hidden(ids, at::ones({1, 4}, at::kLong),
                                 at::arange(4, at::kLong).view({1, 4}), &cache);
  EXPECT_TRUE(at::allclose(model->logits(h), expected, 0, 1e-6));
}

TEST(CausalLm, LlamaWithAttentionAndMlpBiasesMatchesIndependentReference) {
  auto c = llama_tied();
  c.tie_word_embeddings = false;
  c.attention_bias = true; // q/k/v and, for Llama, o_proj
  c.mlp_bias = true;
  auto names = expected_weight_names(c);
  ASSERT_NE(std::find(names.begin(), names.end(), "model.layers.0.self_attn.o_proj.bias"), names.end());
  ASSERT_NE(std::find(names.begin(), names.end(), "model.layers.1.mlp.down_proj.bias"), names.end());
  expect_matches_reference(c);
}

TEST(CausalLm, KvCacheAppendsInPlaceAndCopiedCachesStayIndependent) {
  auto c = llama_tied();
  auto model = causal_lm::from_weights(c, spread_weights(c, 14));
  c10::NoGradGuard ng;
  kv_cache cache;
  auto prompt = at::tensor({3, 4, 5}, at::kLong).view({1, 3});
  model->forward_hidden(prompt, at::ones({1, 3}, at::kLong), at::arange(3, at::kLong).view({1, 3}),
                        &cache);
  auto step = [&](kv_cache& kc, int64_t token) {
    auto t = kc.length();
    return model->logits(model->forward_hidden(at::full({1, 1}, token, at::kLong),
                                               at::ones({1, t + 1}, at::kLong),
                                               at::full({1, 1}, t, at::kLong), &kc))[0][0];
  };
  // One step reallocates (the prefill filled its buffer exactly?), later steps reuse the buffer.
  step(cache, 6);
  auto buffer = cache.keys[0].data_ptr();
  step(cache, 7);
  EXPECT_EQ(cache.keys[0].data_ptr(), buffer);
  EXPECT_EQ(cache.length(), 5);
  // A copy of the cache shares the buffer; appending to either must not disturb the other.
  kv_cache other = cache;
  auto a = step(cache, 8);
  auto b = step(other, 9);
  auto full_a = full_logits(*model, at::tensor({3, 4, 5, 6, 7, 8}, at::kLong).view({1, 6}));
  auto full_b = full_logits(*model, at::tensor({3, 4, 5, 6, 7, 9}, at::kLong).view({1, 6}));
  EXPECT_LT((a - full_a[0][5]).abs().max().item<double>(), 1e-5);
  EXPECT_LT((b - full_b[0][5]).abs().max().item<double>(), 1e-5);
  // Continuing both after the split still matches.
  auto a2 = step(cache, 10);
  auto full_a2 = full_logits(*model, at::tensor({3, 4, 5, 6, 7, 8, 10}, at::kLong).view({1, 7}));
  EXPECT_LT((a2 - full_a2[0][6]).abs().max().item<double>(), 1e-5);
  // A cache narrowed from the front (common padding dropped) keeps appending correctly.
  kv_cache narrowed;
  auto padded = at::tensor({0, 0, 3, 4, 5}, at::kLong).view({1, 5});
  auto mask = at::tensor({0, 0, 1, 1, 1}, at::kLong).view({1, 5});
  model->forward_hidden(padded, mask, (mask.cumsum(1) - 1).clamp_min(0), &narrowed);
  for (auto& k : narrowed.keys)
    k = k.narrow(2, 2, 3);
  for (auto& v : narrowed.values)
    v = v.narrow(2, 2, 3);
  auto n1 = step(narrowed, 6);
  auto n2 = step(narrowed, 7);
  auto full_n = full_logits(*model, at::tensor({3, 4, 5, 6, 7}, at::kLong).view({1, 5}));
  EXPECT_LT((n1 - full_n[0][3]).abs().max().item<double>(), 1e-5);
  EXPECT_LT((n2 - full_n[0][4]).abs().max().item<double>(), 1e-5);
}

// Decode throughput of the continuous-batching engine on one device: for each batch size, that
// many requests of a random `--prompt`-token prompt each, greedy, exactly `--new` tokens (no
// stop token), prefill included, as transformers' generate is timed by its peer
// (bench/gpu/pytorch_peer.py `decode`). Weights stored in bf16 (as engines hold them) or fp32;
// the KV cache in the compute dtype on a CUDA device. One JSON object per batch size
// (figure "decode", impl "rlforge").
//
//   gpu_decode_bench [--device cuda|cpu] [--preset qwen2.5-0.5b] [--batches 1,8,64,256]
//                    [--prompt 64] [--new 64] [--dtype bf16|fp32] [--kv-mib 16384] [--reps 3]
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "backends/devices.hpp"
#include "backends/engine/continuous_engine.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/model_config.hpp"
#include "bench/gpu/bench_json.hpp"

namespace be = rlforge::backends;
namespace gb = rlforge::gpu_bench;

int main(int argc, char** argv) {
  std::string device_name = "cuda", preset = "qwen2.5-0.5b", dtype_name = "bf16";
  std::string batches_text = "1,8,64,256";
  int64_t prompt = 64, fresh = 64, kv_mib = 16384;
  int reps = 3;
  gb::flags f(argc, argv,
              "gpu_decode_bench [--device cuda|cpu] [--preset NAME] [--batches LIST] "
              "[--prompt P] [--new N] [--dtype bf16|fp32] [--kv-mib M] [--reps R]");
  while (f.next()) {
    if (f.is("--device")) device_name = f.value();
    else if (f.is("--preset")) preset = f.value();
    else if (f.is("--dtype")) dtype_name = f.value();
    else if (f.is("--batches")) batches_text = f.value();
    else if (f.is("--prompt")) prompt = f.integer();
    else if (f.is("--new")) fresh = f.integer();
    else if (f.is("--kv-mib")) kv_mib = f.integer();
    else if (f.is("--reps")) reps = static_cast<int>(f.integer());
    else f.unknown();
  }
  std::vector<int64_t> batches;
  std::stringstream list(batches_text);
  for (std::string item; std::getline(list, item, ',');)
    batches.push_back(std::atoll(item.c_str()));
  if (prompt < 1 || fresh < 1 || kv_mib < 1 || reps < 1 || batches.empty()) {
    std::fprintf(stderr, "gpu_decode_bench: sizes must be >= 1\n");
    return 2;
  }
  const auto device = gb::parse_device(device_name);
  be::bind_thread_to(device);
  const auto dtype = be::parse_compute_dtype(dtype_name);
  auto config = be::preset(preset);
  config.eos_token_ids.clear(); // exactly --new tokens per request
  auto model = be::causal_lm::random(config, 1);
  if (dtype == be::compute_dtype::bf16)
    model->store_weights_in_bf16();
  model->to(device);
  model->set_training(false);
  be::engine_config cfg;
  cfg.kv_cache_bytes = kv_mib << 20;
  cfg.max_num_seqs = 256;
  cfg.max_step_tokens = 8192;
  be::continuous_engine engine(*model, cfg);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  uint64_t next_id = 0;
  for (auto b : batches) {
    auto run = [&] {
      for (int64_t r = 0; r < b; ++r) {
        auto ids = at::randint(0, config.vocab_size, {prompt}, gen, at::kLong);
        be::engine_request req;
        req.prompt.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + prompt);
        req.params.max_tokens = fresh;
        req.params.temperature = 0.0;
        req.seeds = {std::nullopt};
        engine.add(next_id++, std::move(req));
      }
      int64_t tokens = 0;
      while (engine.has_work())
        for (auto& o : engine.step(0, 1))
          tokens += static_cast<int64_t>(o.samples.at(0).tokens.size());
      if (tokens != b * fresh)
        std::fprintf(stderr, "gpu_decode_bench: %lld tokens, expected %lld\n",
                     static_cast<long long>(tokens), static_cast<long long>(b * fresh));
    };
    const double seconds = gb::timed(device, reps, 1, run);
    gb::emit({{"figure", "decode"},
              {"impl", "rlforge"},
              {"device", be::describe(device)},
              {"preset", preset},
              {"dtype", dtype_name},
              {"batch", b},
              {"prompt", prompt},
              {"new_tokens", fresh},
              {"seconds", seconds},
              {"tokens_per_s", static_cast<double>(b * fresh) / seconds}});
  }
  return 0;
}

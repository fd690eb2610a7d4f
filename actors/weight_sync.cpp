#include "actors/weight_sync.hpp"

#include <c10/core/GradMode.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/actor_kind.hpp"
#include "actors/engine.hpp"
#include "actors/rendezvous_store.hpp"
#include "actors/worker.hpp"

#include "backends/collective_group.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/lora.hpp"
#include "backends/weights/cuda_ipc_transport.hpp"
#include "backends/weights/gloo_transport.hpp"
#include "backends/weights/in_process_transport.hpp"
#include "backends/weights/shm_transport.hpp"

namespace rlforge::actors {

namespace {

namespace be = rlforge::backends;
using be::error_code;

std::string read_first_line(const char* path) {
  std::ifstream in{path};
  std::string line;
  std::getline(in, line);
  return line;
}

be::transport_options options_of(const weight_sync_spec& spec, const char* who) {
  if (spec.timeout_ms <= 0)
    be::fail(error_code::invalid_argument,
             std::string{who} + ": timeout_ms must be > 0, got " + std::to_string(spec.timeout_ms));
  if (spec.bucket_bytes < 0)
    be::fail(error_code::invalid_argument, std::string{who} + ": bucket_bytes must be >= 0, got " +
                                               std::to_string(spec.bucket_bytes));
  if (spec.version < 1)
    be::fail(error_code::invalid_argument,
             std::string{who} + ": version must be >= 1, got " + std::to_string(spec.version));
  if (spec.channel.empty())
    be::fail(error_code::invalid_argument, std::string{who} + ": the channel name is empty");
  if (spec.delta && spec.transport != "gloo")
    be::fail(error_code::invalid_argument,
             std::string{who} + ": delta transfers go through gloo channels; transport '" +
                 spec.transport + "' moves whole weights");
  be::transport_options o;
  if (spec.bucket_bytes > 0)
    o.bucket_bytes = static_cast<std::uint64_t>(spec.bucket_bytes);
  o.timeout = std::chrono::milliseconds{spec.timeout_ms};
  return o;
}

std::unique_ptr<be::collective_group> join_group(const weight_sync_spec& spec) {
  be::collective_options co;
  co.interface_host = advertised_address();
  co.timeout = std::chrono::milliseconds{spec.timeout_ms};
  co.group_name = "weights-" + spec.channel;
  // Two connections and two threads: the two buckets the pipeline keeps in flight travel at
  // once (gloo_transport.cpp); measured in bench/cluster_bench.
  co.gloo_threads = 2;
  co.gloo_connections = 2;
  return be::collective_group::create(connect_rendezvous_store(spec.store, co.timeout), spec.rank,
                                      spec.world_size, co);
}

std::uint64_t bytes_of(const be::named_tensors& weights) {
  std::uint64_t n = 0;
  for (auto& [name, t] : weights)
    n += static_cast<std::uint64_t>(t.numel()) * t.element_size();
  return n;
}

/// `<path>.weight` for an adapter's tensor `<path>.lora_A.weight` / `<path>.lora_B.weight`; ""
/// for any other name.
std::string adapter_base(const std::string& name) {
  for (const char* suffix : {".lora_A.weight", ".lora_B.weight"}) {
    const std::string s{suffix};
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0)
      return name.substr(0, name.size() - s.size()) + ".weight";
  }
  return {};
}

/// After an adapter sync committed: each adapted weight of `model` becomes its merge.
void merge_adapters(be::causal_lm& model, const be::named_tensors& adapters) {
  if (adapters.empty())
    return;
  // targets_for made sure every adapted weight has its base, both adapters and the scaling.
  std::map<std::string, at::Tensor> in(adapters.begin(), adapters.end());
  c10::NoGradGuard no_grad;
  const double s = in.at(lora_scaling_name).item<double>();
  const std::string suffix = ".weight";
  for (auto& [name, p] : model.named_parameters()) {
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const auto path = name.substr(0, name.size() - suffix.size());
    auto a = in.find(path + ".lora_A.weight");
    if (a != in.end())
      p.copy_(be::merged_lora_weight(in.at(name), a->second, in.at(path + ".lora_B.weight"), s));
  }
}

std::string read_link(const char* path) {
  char buf[256] = {};
  auto n = ::readlink(path, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string{};
}

struct advertised {
  std::mutex mutex;
  std::string address = "127.0.0.1";

  static advertised& get() {
    static advertised a;
    return a;
  }
};

} // namespace

be::named_tensors sync_targets(const be::weight_manifest& m, const be::named_tensors& params,
                              be::named_tensors& adapters) {
  std::set<std::string> adapted, in_manifest;
  bool any = false;
  for (auto& t : m.tensors) {
    in_manifest.insert(t.name);
    if (auto base = adapter_base(t.name); !base.empty())
      adapted.insert(base);
    any = any || t.name == lora_scaling_name;
  }
  if (adapted.empty() && !any) {
    adapters.clear();
    return params;
  }
  // Refused before anything is written: a merge needs both adapters, the base and the scaling.
  auto need = [&](const std::string& name) {
    if (!in_manifest.count(name))
      be::fail(error_code::invalid_argument,
               "receive_weights: an adapter sync without '" + name + "'");
  };
  need(lora_scaling_name);
  for (auto& base : adapted) {
    const auto path = base.substr(0, base.size() - std::string{".weight"}.size());
    need(base);
    need(path + ".lora_A.weight");
    need(path + ".lora_B.weight");
  }
  std::map<std::string, at::Tensor> param_by_name(params.begin(), params.end());
  std::map<std::string, at::Tensor> kept(adapters.begin(), adapters.end());
  be::named_tensors out, inbox;
  for (auto& t : m.tensors) {
    if (t.name == lora_scaling_name || adapted.count(t.name) || !adapter_base(t.name).empty()) {
      auto k = kept.find(t.name);
      auto slot = k != kept.end() && k->second.scalar_type() == t.dtype &&
                          k->second.sizes().vec() == t.shape
                      ? k->second
                      : at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
      inbox.emplace_back(t.name, slot);
      out.emplace_back(t.name, slot);
    } else if (auto p = param_by_name.find(t.name); p != param_by_name.end()) {
      out.emplace_back(t.name, p->second);
    }
  }
  for (auto& [name, t] : params)
    if (!in_manifest.count(name) && !adapted.count(name))
      out.emplace_back(name, t);
  adapters = std::move(inbox);
  return out;
}

// -- weight_channels ---------------------------------------------------------------------------

struct weight_channels::impl {
  /// One open channel: the group first, then the end that borrows it (destroyed first).
  struct channel {
    std::unique_ptr<be::collective_group> group;
    std::unique_ptr<be::gloo_sender> sender;
    std::unique_ptr<be::gloo_receiver> receiver;
    int32_t rank = 0;
    int32_t world_size = 0;
    weight_channels::link_state link; ///< the sender's measurement and bucket size
    /// A receiver of adapter syncs: the tensors they land in (adapted weights' fp32 bases, the
    /// adapters, the scaling), kept so that the next one can come as a delta.
    be::named_tensors adapters;
    ~channel() {
      sender.reset();
      receiver.reset();
      group.reset();
    }
  };
  std::map<std::string, std::unique_ptr<channel>> open;
  uint64_t opened = 0;
  uint64_t reused = 0;

  /// The channel `spec` names, opened (rendezvous) when this end has not got it yet. A channel
  /// name always means the same ranks: a spec that disagrees with the open one is refused.
  channel& get(const weight_sync_spec& spec, const be::transport_options& opts) {
    auto i = open.find(spec.channel);
    if (i != open.end()) {
      if (i->second->rank != spec.rank || i->second->world_size != spec.world_size)
        be::fail(error_code::invalid_argument,
                 "weight sync: gloo channel '" + spec.channel + "' is open as rank "
                     + std::to_string(i->second->rank) + " of "
                     + std::to_string(i->second->world_size) + ", the transfer names rank "
                     + std::to_string(spec.rank) + " of " + std::to_string(spec.world_size));
      ++reused;
      return *i->second;
    }
    auto c = std::make_unique<channel>();
    c->rank = spec.rank;
    c->world_size = spec.world_size;
    c->group = join_group(spec);
    if (spec.rank == 0)
      c->sender = std::make_unique<be::gloo_sender>(*c->group, opts);
    else
      c->receiver = std::make_unique<be::gloo_receiver>(*c->group, opts);
    ++opened;
    return *open.emplace(spec.channel, std::move(c)).first->second;
  }

  /// Runs `transfer` on the channel `spec` names; a failure closes the channel.
  template <class F> auto use(const weight_sync_spec& spec, const be::transport_options& opts,
                              F&& transfer) {
    try {
      return transfer(get(spec, opts));
    } catch (...) {
      open.erase(spec.channel);
      throw;
    }
  }
};

weight_channels::weight_channels() : impl_(std::make_unique<impl>()) {}
weight_channels::~weight_channels() = default;
weight_channels::weight_channels(weight_channels&&) noexcept = default;
weight_channels& weight_channels::operator=(weight_channels&&) noexcept = default;

size_t weight_channels::open_now() const noexcept {
  return impl_->open.size();
}

uint64_t weight_channels::opened() const noexcept {
  return impl_->opened;
}

uint64_t weight_channels::reused() const noexcept {
  return impl_->reused;
}

std::optional<weight_channels::link_state> weight_channels::link(const std::string& channel) const {
  auto i = impl_->open.find(channel);
  if (i == impl_->open.end())
    return std::nullopt;
  return i->second->link;
}

void weight_channels::forget_bases() {
  for (auto& [name, c] : impl_->open)
    if (c->receiver)
      c->receiver->forget_base();
}

void weight_channels::keep_only(const std::vector<std::string>& keep) {
  for (auto i = impl_->open.begin(); i != impl_->open.end();)
    if (std::find(keep.begin(), keep.end(), i->first) == keep.end())
      i = impl_->open.erase(i);
    else
      ++i;
}

// -- placement of transfers --------------------------------------------------------------------

void set_advertised_address(const std::string& address) {
  auto& a = advertised::get();
  std::lock_guard<std::mutex> guard{a.mutex};
  a.address = address;
}

std::string advertised_address() {
  auto& a = advertised::get();
  std::lock_guard<std::mutex> guard{a.mutex};
  return a.address;
}

process_location this_process() {
  static const process_location here = [] {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    process_location p;
    // The network namespace is part of the identity: the shm transport's abstract socket is
    // per namespace, so a process in another one cannot reach it even on the same host.
    p.host = std::string{name} + "/" + read_first_line("/proc/sys/kernel/random/boot_id") + "/"
             + read_link("/proc/self/ns/net");
    p.pid = static_cast<int64_t>(::getpid());
    return p;
  }();
  auto out = here;
  out.address = advertised_address();
  return out;
}

std::string new_sync_channel() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rlforge-sync-%016llx-%lld-%llu",
                static_cast<unsigned long long>(nonce), static_cast<long long>(::getpid()),
                static_cast<unsigned long long>(++counter));
  return buf;
}

std::string choose_transport(const process_location& sender, const process_location& receiver) {
  auto on_cuda = [](const process_location& p) { return p.device.rfind("cuda", 0) == 0; };
  if (sender.host == receiver.host) {
    if (sender.pid == receiver.pid)
      return "in_process";
    return on_cuda(sender) && on_cuda(receiver) ? "cuda_ipc" : "shm";
  }
  return "gloo";
}

std::vector<std::pair<std::string, at::Tensor>> weights_for_sync(const be::causal_lm& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  // A model computing in bf16 feeds bf16 engines, which store their GEMM weights in bf16
  // (causal_lm::store_weights_in_bf16): those go as bf16, half the bytes.
  const bool bf16 = model.compute_precision() == be::compute_dtype::bf16;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    if (name == "value_head.weight")
      return;
    out.emplace_back(name, bf16 && be::causal_lm::is_gemm_weight(name)
                               ? t.detach().to(at::kBFloat16)
                               : t.detach());
  };
  if (model.has_lora()) {
    for (auto& [name, t] : model.state_dict())
      add(name, t);
    return out;
  }
  for (auto& [name, t] : model.named_parameters())
    add(name, t);
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> adapters_for_sync(const be::causal_lm& model) {
  if (!model.has_lora())
    return {};
  auto params = model.named_parameters();
  std::set<std::string> names, adapted;
  for (auto& [name, t] : params) {
    names.insert(name);
    if (auto base = adapter_base(name); !base.empty())
      adapted.insert(base);
  }
  for (auto& base : adapted)
    if (!names.count(base))
      return {}; // an adapter on a weight the model does not hold on its own (tied lm_head)
  const bool bf16 = model.compute_precision() == be::compute_dtype::bf16;
  std::vector<std::pair<std::string, at::Tensor>> out;
  c10::NoGradGuard no_grad;
  for (auto& [name, t] : params) {
    if (name == "value_head.weight")
      continue;
    const bool as_is = adapted.count(name) || !adapter_base(name).empty() ||
                       !(bf16 && be::causal_lm::is_gemm_weight(name));
    out.emplace_back(name, as_is ? t.detach() : t.detach().to(at::kBFloat16));
  }
  out.emplace_back(lora_scaling_name, at::scalar_tensor(model.lora().scaling(), at::kDouble));
  return out;
}

int64_t send_model_weights(const be::causal_lm& model, const weight_sync_spec& spec,
                           weight_channels& channels) {
  const char* who = worker_ops::send_weights.name;
  auto opts = options_of(spec, who);
  auto weights = spec.delta ? adapters_for_sync(model) : decltype(weights_for_sync(model)){};
  if (weights.empty())
    weights = weights_for_sync(model);
  const auto bytes = bytes_of(weights);
  auto version = static_cast<std::uint64_t>(spec.version);
  if (spec.transport == "cuda_ipc") {
    auto link = be::listen_socket_link(spec.channel, opts.timeout);
    be::cuda_ipc_sender{link, model.device(), opts}.send(weights, version);
    return static_cast<int64_t>(bytes);
  }
  // The host transports read host memory: weights on a CUDA device go through it.
  if (!model.device().is_cpu()) {
    c10::NoGradGuard no_grad;
    for (auto& [name, t] : weights)
      t = t.to(at::kCPU);
  }
  if (spec.transport == "in_process") {
    auto channel = be::named_in_process_channel(spec.channel, opts);
    be::in_process_sender{channel}.send(weights, version);
  } else if (spec.transport == "shm") {
    auto link = be::listen_socket_link(spec.channel, opts.timeout);
    be::shm_sender{link, opts}.send(weights, version);
  } else if (spec.transport == "gloo") {
    if (spec.rank != 0)
      be::fail(error_code::invalid_argument, std::string{who} +
                                                 ": the sender is gloo rank 0, got rank " +
                                                 std::to_string(spec.rank));
    return channels.impl_->use(spec, opts, [&](auto& c) {
      c.sender->set_delta(spec.delta);
      // Bucket size 0: chosen from the link this channel measured on its previous transfer.
      if (spec.bucket_bytes == 0)
        c.sender->set_bucket_bytes(be::bucket_bytes_for_link(c.link.bytes_per_second, bytes));
      c.link.bucket_bytes = c.sender->bucket_bytes();
      const auto start = std::chrono::steady_clock::now();
      c.sender->send(weights, version);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      // A delta transfer sent its encoded buckets only; its time says little of the link (the
      // encoding and fixed costs weigh more), so only full transfers measure it.
      const auto& sent = c.sender->last_transfer();
      if (!sent.delta && took.count() > 0)
        c.link.bytes_per_second = static_cast<double>(bytes) / took.count();
      return static_cast<int64_t>(sent.delta ? sent.wire_bytes : bytes);
    });
  } else {
    be::fail(error_code::invalid_argument, std::string{who} + ": unknown transport '" +
                                               spec.transport +
                                               "' (transports: in_process, shm, cuda_ipc, gloo)");
  }
  return static_cast<int64_t>(bytes);
}

int64_t receive_model_weights(be::causal_lm& model, int64_t current_version,
                              const weight_sync_spec& spec, bool& torn,
                              weight_channels& channels) {
  const char* who = engine_ops::receive_weights.name;
  torn = false;
  auto opts = options_of(spec, who);
  if (current_version < 0)
    be::fail(error_code::invalid_argument, std::string{who} + ": current version must be >= 0");
  // The parameters themselves, not detached aliases: a Gloo commit gives each its new storage
  // (gloo_transport.hpp), which an alias would not pass on to the model.
  c10::NoGradGuard no_grad;
  be::named_tensors targets;
  for (auto& [name, t] : model.named_parameters())
    if (name != "value_head.weight")
      targets.emplace_back(name, t);
  // The host transports write host memory: a model on a CUDA device receives into host copies
  // and takes them once the transfer committed (so a refused one still changes nothing).
  be::named_tensors device_targets;
  if (spec.transport != "cuda_ipc" && !model.device().is_cpu()) {
    device_targets = std::move(targets);
    targets.clear();
    for (auto& [name, t] : device_targets)
      targets.emplace_back(name, at::empty_like(t, t.options().device(at::kCPU)));
  }
  auto current = static_cast<std::uint64_t>(current_version);
  // Each transport checks `spec.version` against `current` and reports a refusal to the sender.
  auto run = [&](be::weight_receiver& r) {
    r.assume_version(current);
    try {
      return r.receive(targets);
    } catch (...) {
      torn = r.version() != current;
      throw;
    }
  };
  std::uint64_t got = 0;
  const be::named_tensors* adapters = nullptr; // a Gloo channel's adapter tensors
  if (spec.transport == "cuda_ipc") {
    be::cuda_ipc_receiver r{be::connect_socket_link(spec.channel, opts.timeout), model.device(),
                            opts};
    got = run(r);
  } else if (spec.transport == "in_process") {
    be::in_process_receiver r{be::named_in_process_channel(spec.channel, opts)};
    got = run(r);
  } else if (spec.transport == "shm") {
    be::shm_receiver r{be::connect_socket_link(spec.channel, opts.timeout), opts};
    got = run(r);
  } else if (spec.transport == "gloo") {
    if (spec.rank < 1 || spec.rank >= spec.world_size)
      be::fail(error_code::invalid_argument,
               std::string{who} + ": a receiver's gloo rank must be in [1, " +
                   std::to_string(spec.world_size) + "), got " + std::to_string(spec.rank));
    channels.keep_only({spec.channel});
    got = channels.impl_->use(spec, opts, [&](auto& c) {
      c.receiver->assume_version(current);
      auto v = c.receiver->receive_for(
          [&](const be::weight_manifest& m) { return sync_targets(m, targets, c.adapters); });
      adapters = &c.adapters;
      return v;
    });
  } else {
    be::fail(error_code::invalid_argument, std::string{who} + ": unknown transport '" +
                                               spec.transport +
                                               "' (transports: in_process, shm, cuda_ipc, gloo)");
  }
  for (size_t i = 0; i < device_targets.size(); ++i)
    device_targets[i].second.copy_(targets[i].second);
  // An adapter sync: its adapted weights are merged in last (over whatever the loop above
  // copied for them).
  if (adapters)
    merge_adapters(model, *adapters);
  if (got != static_cast<std::uint64_t>(spec.version))
    be::fail(error_code::internal, std::string{who} + ": committed version " + std::to_string(got) +
                                       ", expected " + std::to_string(spec.version));
  return spec.version;
}

caf::expected<int64_t> send_weights_op(rank_context& ctx,
                                            const std::vector<weight_sync_spec>& specs) {
  const auto& model = worker_model(ctx, worker_ops::send_weights.name);
  if (ctx.info.rank != 0)
    return int64_t{0};
  auto& channels = worker_weight_channels(ctx);
  std::vector<std::string> named;
  for (auto& spec : specs)
    if (spec.transport == "gloo")
      named.push_back(spec.channel);
  channels.keep_only(named);
  // Every receiver gets its transfer even when an earlier one refused it (each then answers
  // for itself instead of waiting out its timeout); the first failure is reported.
  int64_t bytes = 0;
  std::exception_ptr first;
  for (auto& spec : specs) {
    try {
      bytes += send_model_weights(model, spec, channels);
    } catch (...) {
      if (!first)
        first = std::current_exception();
    }
  }
  if (first)
    std::rethrow_exception(first);
  return bytes;
}

} // namespace rlforge::actors

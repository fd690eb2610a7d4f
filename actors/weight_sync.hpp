#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "runtime/messages.hpp"

#include "backends/weights/weight_transport.hpp"

namespace rlforge::backends {
class causal_lm;
} // namespace rlforge::backends

namespace rlforge::actors {

/// Where a rank runs: a host identity (host name, boot id and network namespace, so two
/// containers, two reboots or two network namespaces with one host name differ: shared memory
/// and its abstract socket only reach peers with the same identity), the process id, and the
/// address peers on other hosts reach this process at (the node's advertised address). Ranks
/// answer it through the built-in op `location` as (host, pid, address).
struct process_location {
  std::string host;
  int64_t pid = 0;
  std::string address = "127.0.0.1";
  /// Where the rank's weights live: "cpu" or "cuda:N" (a rank's `location` op fills it;
  /// `this_process` leaves "cpu").
  std::string device = "cpu";
};

/// This process's location.
process_location this_process();

/// Sets the address this process advertises to peers (a node's `--node-ip`; default
/// 127.0.0.1): Gloo groups and TCP stores of its ranks bind to it and peers connect to it. Call
/// before ranks start. Thread-safe.
void set_advertised_address(const std::string& address);

/// The address set by `set_advertised_address`.
std::string advertised_address();

/// A fresh name for one transfer's meeting point (in-process channel, shared-memory socket, Gloo
/// store and group), unique across every process and host of a cluster: a random per-process
/// nonce, the pid and a process-wide counter. Every transfer must use its own: two transfers
/// meeting on one name would deliver one sender's weights to the other's receivers.
/// Thread-safe.
std::string new_sync_channel();

/// The fastest weight transport that reaches `receiver` from `sender`: "in_process" when they
/// share a process; when they share a host identity (host, boot and network namespace),
/// "cuda_ipc" if both hold their weights on CUDA devices, else "shm"; "gloo" otherwise. The
/// host transports move CUDA weights through host memory (staged on both ends).
std::string choose_transport(const process_location& sender, const process_location& receiver);

/// The weights a trainer sends to its engines: the policy's base weights under Hugging Face
/// names with any LoRA update merged in (`causal_lm::state_dict()`, copies) or, without LoRA,
/// the live parameters themselves (no copy); never the value head.
/// Exposed for tests; `send_model_weights` sends exactly these.
std::vector<std::pair<std::string, at::Tensor>> weights_for_sync(const backends::causal_lm& model);

/// The name of the 0-d fp64 tensor that carries the adapters' scaling (alpha / rank) in an
/// adapter sync.
inline constexpr const char* lora_scaling_name = "lora.scaling";

/// What a LoRA policy sends in a delta sync, for engines to merge themselves: its base weights
/// unmerged (fp32 where an adapter sits on them, the others as `weights_for_sync` sends them),
/// its adapters (`<path>.lora_A.weight`, `.lora_B.weight`, fp32) and `lora_scaling_name`. The
/// base never changes while the adapters train, so after the first sync a delta carries the
/// adapters alone. Empty without LoRA, or when an adapter sits on a weight the model does not
/// hold on its own (an adapter on a tied lm_head): such a model sends merged weights.
std::vector<std::pair<std::string, at::Tensor>> adapters_for_sync(const backends::causal_lm& model);

/// The tensors a Gloo transfer whose manifest is `m` lands in, on an engine whose parameters are
/// `params`: `params` themselves, except for an adapter sync (`adapters_for_sync`), whose
/// adapters, scaling and adapted weights' bases land in `adapters` (kept from the last one
/// where name, shape and dtype still match, else new). A name that is neither is left out and
/// a parameter the manifest lacks stays in, for `check_transfer` to name them. A transfer
/// without adapters empties `adapters`. Throws `backends::error{invalid_argument}` naming what
/// an adapter sync lacks (an adapter's partner, its base or the scaling) before anything is
/// written. Exposed for tests; `receive_model_weights` calls it.
backends::named_tensors sync_targets(const backends::weight_manifest& m,
                                     const backends::named_tensors& params,
                                     backends::named_tensors& adapters);

/// The Gloo weight channels one rank keeps open between transfers: per channel name
/// (`weight_sync_spec::channel`), its Gloo group and its sender or receiver with their buffers
/// (the sender's packing space, the receiver's staging). The first transfer naming a channel
/// opens it (a rendezvous through the spec's store actor); every later one reuses it, with no
/// rendezvous and no allocation. A transfer that fails closes its channel (a Gloo group is
/// unusable after a failure), so the next one must name a new channel. Owned and used by one
/// rank, on its thread; not thread-safe.
class weight_channels {
public:
  weight_channels();
  ~weight_channels();
  weight_channels(weight_channels&&) noexcept;
  weight_channels& operator=(weight_channels&&) noexcept;

  /// Channels open now.
  size_t open_now() const noexcept;
  /// Channels this rank has opened (rendezvous done) since it was created.
  uint64_t opened() const noexcept;
  /// Transfers that reused a channel that was already open.
  uint64_t reused() const noexcept;
  /// Closes every channel whose name is not in `keep`.
  void keep_only(const std::vector<std::string>& keep);
  /// The receiver's weights changed by other means (e.g. `set_weights` in place): the next
  /// transfer on each receiving channel comes whole, not as a delta.
  void forget_bases();

  /// What a sending end knows of its channel's link: the rate of its last full (not delta)
  /// transfer (bytes over the time from the header to the receivers' commit; 0 before the
  /// first) and the bucket size of the last transfer. A transfer whose spec leaves `bucket_bytes` 0 takes
  /// `backends::bucket_bytes_for_link` of the rate its predecessor measured.
  struct link_state {
    double bytes_per_second = 0;
    std::uint64_t bucket_bytes = 0;
  };
  /// The link of the open channel `channel` (nullopt when it is not open here).
  std::optional<link_state> link(const std::string& channel) const;

  struct impl;

private:
  friend int64_t send_model_weights(const backends::causal_lm&, const weight_sync_spec&,
                                    weight_channels&);
  friend int64_t receive_model_weights(backends::causal_lm&, int64_t, const weight_sync_spec&,
                                       bool&, weight_channels&);
  std::unique_ptr<impl> impl_;
};

/// Sender side of one planned transfer (`spec.rank` must be 0): sends `weights_for_sync(model)`
/// as `spec.version` through `spec.transport` and returns once the receiver(s) committed it.
/// Gloo transfers go through `channels` (opened on first use), as deltas with `spec.delta`; a
/// LoRA model's delta transfers send `adapters_for_sync(model)` where it has them.
/// Returns the bytes sent: the weights' bytes, or a delta transfer's encoded buckets. Throws
/// `backends::error`: `invalid_argument` for a bad spec or when a receiver rejected the manifest
/// (its reason included where the transport carries it), `timeout` when no receiver took the
/// transfer within `spec.timeout_ms`. Transport "message" is not handled here (the dispatcher
/// moves a `tensor_map`).
int64_t send_model_weights(const backends::causal_lm& model, const weight_sync_spec& spec,
                           weight_channels& channels);

/// Receiver side (an engine, `spec.rank` >= 1 for gloo): waits for the transfer and commits it
/// into `model`'s parameters in place. `spec.version` must exceed `current_version` (checked
/// by the transport, which reports the refusal to the sender). A rejected transfer (a stale
/// version, or names, shapes or dtypes that differ from the model's) changes nothing and throws
/// `backends::error{invalid_argument}` naming the differences; `torn` is set when a transfer
/// broke after the copy began (the shared-memory ring when the sender stops mid-stream), which
/// leaves the weights a mix of two versions. A Gloo transfer uses `channels` and closes the
/// receiver's other channels (an engine listens on one). A transfer of adapters
/// (`adapters_for_sync`) lands in tensors the channel keeps (the adapted weights' fp32 bases and
/// the adapters); after the commit each adapted weight of `model` becomes
/// `backends::merged_lora_weight` of them, in the weight's dtype: the bits a merged sync brings.
/// Returns the version now held.
int64_t receive_model_weights(backends::causal_lm& model, int64_t current_version,
                              const weight_sync_spec& spec, bool& torn,
                              weight_channels& channels);

struct rank_context;

/// The trainer side of a weight sync as an op of the worker kinds (policy): `send_weights`
/// (std::vector<weight_sync_spec>) → int64 bytes sent: rank 0 sends the model's weights
/// (`weights_for_sync`) once per spec, in order, and keeps open only the Gloo channels these
/// specs name; the other ranks answer 0 at once. Refused before init_model and while the model
/// is offloaded.
caf::expected<int64_t> send_weights_op(rank_context& ctx,
                                            const std::vector<weight_sync_spec>& specs);

} // namespace rlforge::actors

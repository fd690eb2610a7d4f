#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rlforge::backends {

/// Named tensors in a fixed order: what a trainer sends (HF names, e.g. from
/// `causal_lm::state_dict()`) and what an engine receives into (e.g. its own
/// `causal_lm::named_parameters()`).
using named_tensors = std::vector<std::pair<std::string, at::Tensor>>;

/// One tensor of a transfer as the manifest describes it.
struct tensor_spec {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::uint64_t bytes = 0; ///< numel * element size
};

/// What a transfer carries: the sender's tensors in the sender's order. Sender and receiver
/// agree on it before any weight byte is copied.
struct weight_manifest {
  std::vector<tensor_spec> tensors;

  /// Sum of `bytes` over all tensors (without the alignment padding of a bucket plan).
  std::uint64_t total_bytes() const;
};

/// Builds the manifest of `weights`. Throws `error{invalid_argument}` naming the tensor for an
/// empty or duplicate name, an undefined tensor or a non-strided (sparse) one.
weight_manifest make_manifest(const named_tensors& weights);

/// Every packed tensor begins at a multiple of this many bytes of the packed layout, so that
/// each one is aligned for any dtype (and for fast copies).
inline constexpr std::uint64_t tensor_alignment = 64;

/// The default bucket size of every transport: 256 MiB.
inline constexpr std::uint64_t default_bucket_bytes = std::uint64_t{256} << 20;

/// Where one tensor lies in the packed layout of a transfer.
struct packed_tensor {
  std::size_t index = 0;     ///< position in the manifest
  std::uint64_t offset = 0;  ///< byte offset in the whole layout (a multiple of tensor_alignment)
  std::uint64_t bytes = 0;
};

/// Consecutive manifest tensors packed contiguously (each aligned to `tensor_alignment`).
struct weight_bucket {
  std::uint64_t offset = 0;           ///< byte offset of the bucket in the whole layout
  std::uint64_t bytes = 0;            ///< from the first tensor's start to the last one's end
  std::vector<packed_tensor> tensors; ///< in manifest order
};

/// How a manifest travels: buckets of at most `bucket_bytes` (a tensor larger than that travels
/// alone in a bucket of its own size), formed greedily in manifest order. Both ends derive the
/// same plan from the same manifest and `bucket_bytes`.
struct bucket_plan {
  std::uint64_t bucket_bytes = default_bucket_bytes;
  std::vector<weight_bucket> buckets;
  std::uint64_t total_bytes = 0;      ///< size of the whole packed layout, padding included
  std::uint64_t max_bucket_bytes = 0; ///< size of the largest bucket (0 for an empty manifest)
};

/// Plans the buckets of `m`. Throws `error{invalid_argument}` when `bucket_bytes` is 0.
bucket_plan make_bucket_plan(const weight_manifest& m, std::uint64_t bucket_bytes);

/// The manifest, version and bucket size as one JSON text: the header that travels before the
/// weights in the shared-memory and collective transports. `delta_base` (collective transports)
/// is the version the sender can send a delta against (weight_delta.hpp); 0 for none.
std::string encode_transfer_header(const weight_manifest& m, std::uint64_t version,
                                   std::uint64_t bucket_bytes, std::uint64_t delta_base = 0);

/// Decoded `encode_transfer_header` text.
struct transfer_header {
  weight_manifest manifest;
  std::uint64_t version = 0;
  std::uint64_t bucket_bytes = 0;
  std::uint64_t delta_base = 0; ///< absent in the text: 0
};

/// Whether two manifests describe the same layout: the same names, dtypes and shapes in the
/// same order.
bool same_layout(const weight_manifest& a, const weight_manifest& b);

/// Parses `encode_transfer_header` text. Throws `error{decode_error}` naming what is malformed
/// (not JSON, a missing field, an unknown dtype, a byte size that disagrees with the shape).
transfer_header decode_transfer_header(const std::string& text);

/// Checks an incoming transfer against the receiver's own tensors before anything is copied:
/// every manifest name must be a target (else "unexpected"), every target must be in the
/// manifest (else "missing"), shapes and dtypes must be equal, `version` must exceed
/// `current_version`, and the targets must be defined, contiguous, on `device` and uniquely
/// named. Throws `error{invalid_argument}` whose message lists the problems (up to 8), each
/// naming the tensor, the expected (receiver) and the actual (sender) value.
void check_transfer(const weight_manifest& incoming, std::uint64_t version,
                    const named_tensors& targets, std::uint64_t current_version,
                    c10::Device device = c10::Device(c10::kCPU));

/// Options shared by every transport.
struct transport_options {
  /// Upper bound of one bucket (> 0); a larger tensor travels alone.
  std::uint64_t bucket_bytes = default_bucket_bytes;
  /// Bound on every wait for the peer (in-process and shared memory; the collective transports
  /// use their group's timeout).
  std::chrono::milliseconds timeout{60000};
};

/// Throws `error{invalid_argument}` naming the field for `bucket_bytes` 0 or a timeout <= 0.
void validate(const transport_options& opts, const char* who);

/// The bucket size for a link measured at `bytes_per_second` (> 0) and a transfer of
/// `total_bytes`: what the link carries in 2 ms (long enough that a collective's fixed cost,
/// ~0.1 ms, stays small), but at most a quarter of the transfer (so a pipeline has buckets to
/// overlap) and within [1 MiB, 64 MiB], rounded down to a multiple of 64 KiB. A link that was
/// never measured (0) gets 4 MiB. Pure; throws `error{invalid_argument}` for a negative or
/// non-finite rate.
std::uint64_t bucket_bytes_for_link(double bytes_per_second, std::uint64_t total_bytes);

/// The sending end of a weight sync (trainer rank 0).
///
/// Thread contract: one thread at a time calls `send`. `send` returns once every receiver has
/// committed the transfer, or throws `error`: `invalid_argument` when a receiver rejected the
/// manifest (its message is included when the transport carries it), `timeout` when no
/// receiver took the transfer in time, `backend_error`/`io_error` for a transport failure.
class weight_sender {
public:
  virtual ~weight_sender();

  /// Sends `weights` (fixed order; CPU tensors unless the transport says otherwise) as version
  /// `version` (>= 1; must exceed every receiver's current version). The tensors must not be
  /// modified until `send` returns.
  virtual void send(const named_tensors& weights, std::uint64_t version) = 0;

  /// The transport's name, e.g. "in_process".
  virtual const char* kind() const noexcept = 0;
};

/// The receiving end of a weight sync (an inference engine).
///
/// Commit contract: a transfer is validated with `check_transfer` before a single byte of the
/// targets changes; a rejected transfer (any `error{invalid_argument}` from `receive`) leaves
/// the targets and `version()` exactly as they were. After acceptance the targets are written
/// only from data that has fully arrived (each transport documents how), so the copy cannot
/// fail half-way.
///
/// Thread contract: one thread at a time calls `receive`; `version()` may be read by that
/// thread between transfers.
class weight_receiver {
public:
  virtual ~weight_receiver();

  /// Waits for one transfer and commits it into `targets` (the engine's live tensors, written
  /// in place); returns the version now held. Throws `error` as described for `weight_sender`.
  virtual std::uint64_t receive(const named_tensors& targets) = 0;

  /// The version of the last committed transfer; 0 before the first (or after a transfer that
  /// broke half-way, when the transport can leave the targets partly written).
  std::uint64_t version() const noexcept { return version_; }

  /// Declares the version the targets already hold, for a receiver made fresh for weights that
  /// were filled before (e.g. by an earlier receiver): incoming versions must exceed it.
  void assume_version(std::uint64_t v) noexcept { version_ = v; }

  /// The transport's name, e.g. "in_process".
  virtual const char* kind() const noexcept = 0;

protected:
  std::uint64_t version_ = 0;
};

namespace detail {

/// The contiguous tensors actually read by a sender: `weights` itself where a tensor is
/// contiguous, a contiguous copy otherwise. Throws `error{invalid_argument}` for a tensor not
/// on `device`, or a version of 0.
named_tensors sender_sources(const named_tensors& weights, std::uint64_t version,
                             c10::Device device, const char* who);

/// The targets in manifest order (`check_transfer` must have accepted them).
std::vector<at::Tensor> targets_in_manifest_order(const weight_manifest& m,
                                                  const named_tensors& targets);

} // namespace detail

} // namespace rlforge::backends

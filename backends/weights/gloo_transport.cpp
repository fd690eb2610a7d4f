#include "backends/weights/gloo_transport.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "backends/error.hpp"

namespace rlforge::backends {

namespace {

// First broadcast of a transfer: {kind, length of the text that follows}.
constexpr int64_t header_transfer = 1;
constexpr int64_t header_abort = 2;

at::TensorOptions bytes_on(c10::Device device) {
  return at::TensorOptions().dtype(at::kByte).device(device);
}

// A uint8 view of a contiguous tensor's bytes (no copy).
at::Tensor byte_view(const at::Tensor& t, std::uint64_t bytes) {
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(bytes)}, bytes_on(t.device()));
}

// Broadcasts {kind, text} from root; on other ranks returns what root sent.
std::pair<int64_t, std::string> broadcast_text(collective_group& group, int root,
                                               c10::Device device, int64_t kind,
                                               const std::string& text) {
  auto head = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  head[0] = kind;
  head[1] = static_cast<int64_t>(text.size());
  auto head_dev = head.to(device);
  group.broadcast(head_dev, root);
  head = head_dev.cpu();
  auto k = head[0].item<int64_t>();
  auto len = head[1].item<int64_t>();
  if (len < 0 || len > (int64_t{1} << 31))
    fail(error_code::decode_error,
         "weight transfer: header length " + std::to_string(len) + " is out of range");
  auto body = at::empty({len}, at::TensorOptions().dtype(at::kByte));
  if (group.rank() == root && len > 0)
    std::memcpy(body.data_ptr(), text.data(), text.size());
  auto body_dev = body.to(device);
  group.broadcast(body_dev, root);
  body = body_dev.cpu();
  return {k, std::string(static_cast<const char*>(body.data_ptr()), static_cast<std::size_t>(len))};
}

// One flag per rank, summed: the ranks that rejected the transfer.
std::vector<int> gather_rejections(collective_group& group, c10::Device device, bool rejected) {
  auto flags = at::zeros({group.world_size()}, at::TensorOptions().dtype(at::kLong));
  flags[group.rank()] = rejected ? 1 : 0;
  auto flags_dev = flags.to(device);
  group.all_reduce_sum(flags_dev);
  flags = flags_dev.cpu();
  std::vector<int> out;
  for (int r = 0; r < group.world_size(); ++r)
    if (flags[r].item<int64_t>() != 0)
      out.push_back(r);
  return out;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

} // namespace

namespace detail {

void check_collective_endpoint(const collective_group& group, int root, bool sending,
                               const char* backend, const transport_options& opts,
                               const char* who) {
  validate(opts, who);
  if (group.options().backend != backend)
    fail(error_code::invalid_argument, std::string(who) + ": needs a '" + backend +
                                           "' group, got a '" + group.options().backend +
                                           "' one");
  if (root < 0 || root >= group.world_size())
    fail(error_code::out_of_range, std::string(who) + ": root " + std::to_string(root) +
                                       " is outside [0, " + std::to_string(group.world_size()) +
                                       ")");
  if (sending && group.rank() != root)
    fail(error_code::invalid_argument, std::string(who) + ": the sender must be the root rank " +
                                           std::to_string(root) + ", this is rank " +
                                           std::to_string(group.rank()));
  if (!sending && group.rank() == root)
    fail(error_code::invalid_argument, std::string(who) + ": rank " + std::to_string(root) +
                                           " is the root (the sender); receivers are the others");
}

void collective_send(collective_group& group, int root, c10::Device device,
                     std::uint64_t bucket_bytes, at::Tensor& bucket_buffer,
                     const named_tensors& weights, std::uint64_t version, const char* who) {
  c10::NoGradGuard no_grad;
  named_tensors sources;
  weight_manifest manifest;
  bucket_plan plan;
  std::string header;
  try {
    sources = sender_sources(weights, version, device, who);
    manifest = make_manifest(sources);
    plan = make_bucket_plan(manifest, bucket_bytes);
    header = encode_transfer_header(manifest, version, bucket_bytes);
  } catch (const error& e) {
    // Tell the receivers why nothing comes, then fail here too.
    broadcast_text(group, root, device, header_abort, e.what());
    throw;
  }
  broadcast_text(group, root, device, header_transfer, header);
  auto rejected = gather_rejections(group, device, false);
  if (!rejected.empty())
    fail(error_code::invalid_argument,
         std::string(who) + ": weight transfer of version " + std::to_string(version) +
             " rejected by rank(s) " + rank_list(rejected) +
             " (their errors name the tensors); no receiver changed its weights");
  // Two-deep pipeline: bucket i is packed while bucket i-1 travels. A bucket of one tensor goes
  // straight from it; a packed one uses the two halves of the bucket buffer in turn (the half
  // bucket i-2 used is free once bucket i is packed).
  std::vector<const weight_bucket*> to_send;
  int64_t half = 0; // the largest packed bucket
  for (const auto& b : plan.buckets)
    if (b.bytes > 0) {
      to_send.push_back(&b);
      if (b.tensors.size() > 1)
        half = std::max(half, static_cast<int64_t>(b.bytes));
    }
  if (half > 0 && (!bucket_buffer.defined() || bucket_buffer.numel() < 2 * half))
    bucket_buffer = at::empty({2 * half}, bytes_on(device));
  group.broadcast_pipelined(
      to_send.size(),
      [&](std::size_t i) {
        const auto& b = *to_send[i];
        if (b.tensors.size() == 1)
          return byte_view(sources[b.tensors.front().index].second, b.bytes);
        auto buf = bucket_buffer.narrow(0, static_cast<int64_t>(i % 2) * half,
                                        static_cast<int64_t>(b.bytes));
        for (const auto& t : b.tensors)
          if (t.bytes > 0)
            buf.narrow(0, static_cast<int64_t>(t.offset - b.offset), static_cast<int64_t>(t.bytes))
                .copy_(byte_view(sources[t.index].second, t.bytes));
        return buf;
      },
      root, 2);
  group.barrier();
}

std::uint64_t collective_receive(collective_group& group, int root, c10::Device device,
                                 receive_buffers& buffers, const named_tensors& targets,
                                 std::uint64_t& version, const char* who) {
  c10::NoGradGuard no_grad;
  auto [kind, text] = broadcast_text(group, root, device, 0, {});
  if (kind == header_abort)
    fail(error_code::invalid_argument, std::string(who) + ": the sender aborted the transfer: " +
                                           text);
  if (kind != header_transfer)
    fail(error_code::decode_error,
         std::string(who) + ": unknown transfer header kind " + std::to_string(kind));
  transfer_header h;
  std::optional<error> mine;
  try {
    h = decode_transfer_header(text);
    check_transfer(h.manifest, h.version, targets, version, device);
  } catch (const error& e) {
    mine.emplace(e.code(), std::string(who) + " (rank " + std::to_string(group.rank()) +
                               "): " + e.what());
  }
  auto rejected = gather_rejections(group, device, mine.has_value());
  if (mine)
    throw *mine;
  if (!rejected.empty())
    fail(error_code::invalid_argument,
         std::string(who) + " (rank " + std::to_string(group.rank()) + "): weight transfer of " +
             "version " + std::to_string(h.version) + " aborted because rank(s) " +
             rank_list(rejected) + " rejected it; weights unchanged");
  auto plan = make_bucket_plan(h.manifest, h.bucket_bytes);
  auto& staging = buffers.staging;
  // The staging buffer must be one no target views (a target that was copied into, not
  // swapped, at the last commit may still view the buffer before it).
  bool viewed = false;
  if (staging.defined())
    for (const auto& [name, t] : targets)
      viewed = viewed || t.storage().is_alias_of(staging.storage());
  if (!staging.defined() || viewed
      || static_cast<std::uint64_t>(staging.numel()) < plan.total_bytes)
    staging = at::empty({static_cast<int64_t>(plan.total_bytes)}, bytes_on(device));
  // The same pipeline as the sender's: the next bucket's receive is posted while one arrives.
  std::vector<const weight_bucket*> to_receive;
  for (const auto& b : plan.buckets)
    if (b.bytes > 0)
      to_receive.push_back(&b);
  group.broadcast_pipelined(
      to_receive.size(),
      [&](std::size_t i) {
        return staging.narrow(0, static_cast<int64_t>(to_receive[i]->offset),
                              static_cast<int64_t>(to_receive[i]->bytes));
      },
      root, 2);
  // Every bucket arrived: commit. A target takes its bytes of the staging buffer as its storage
  // (no copy) when it is contiguous, on `device`, and its offset is a multiple of its element
  // size; any other is copied into. The buffer the targets viewed before becomes the next
  // staging buffer.
  auto dst = targets_in_manifest_order(h.manifest, targets);
  for (const auto& b : plan.buckets)
    for (const auto& t : b.tensors) {
      if (t.bytes == 0)
        continue;
      auto& target = dst[t.index];
      const auto element = static_cast<std::uint64_t>(target.element_size());
      if (target.is_contiguous() && target.device() == device && t.offset % element == 0) {
        target.set_(staging.storage(), static_cast<int64_t>(t.offset / element), target.sizes(),
                    target.strides());
        continue;
      }
      auto src = staging.narrow(0, static_cast<int64_t>(t.offset), static_cast<int64_t>(t.bytes));
      if (device.is_cpu() && target.is_contiguous())
        std::memcpy(target.data_ptr(), src.data_ptr(), t.bytes);
      else
        target.view({-1}).view(at::kByte).copy_(src);
    }
  std::swap(buffers.staging, buffers.live);
  version = h.version;
  group.barrier();
  return version;
}

} // namespace detail

gloo_sender::gloo_sender(collective_group& group, transport_options opts, int root)
    : group_(group), opts_(opts), root_(root) {
  detail::check_collective_endpoint(group, root, true, "gloo", opts, "gloo sender");
}

void gloo_sender::send(const named_tensors& weights, std::uint64_t version) {
  detail::collective_send(group_, root_, c10::Device(c10::kCPU), opts_.bucket_bytes,
                          bucket_buffer_, weights, version, "gloo sender");
}

void gloo_sender::set_bucket_bytes(std::uint64_t bytes) {
  auto o = opts_;
  o.bucket_bytes = bytes;
  validate(o, "gloo sender");
  opts_ = o;
}

gloo_receiver::gloo_receiver(collective_group& group, transport_options opts, int root)
    : group_(group), opts_(opts), root_(root) {
  detail::check_collective_endpoint(group, root, false, "gloo", opts, "gloo receiver");
}

std::uint64_t gloo_receiver::receive(const named_tensors& targets) {
  return detail::collective_receive(group_, root_, c10::Device(c10::kCPU), buffers_, targets,
                                    version_, "gloo receiver");
}

} // namespace rlforge::backends

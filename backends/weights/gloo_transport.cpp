#include "backends/weights/gloo_transport.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "backends/error.hpp"
#include "backends/weights/weight_delta.hpp"

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

// Two flags per rank, summed: the ranks that rejected the transfer, and the ranks that cannot
// take it as a delta.
struct rank_flags {
  std::vector<int> rejected;
  std::vector<int> lacking_base;
};

rank_flags gather_flags(collective_group& group, c10::Device device, bool rejected,
                        bool lacking_base) {
  const auto n = group.world_size();
  auto flags = at::zeros({2 * n}, at::TensorOptions().dtype(at::kLong));
  flags[group.rank()] = rejected ? 1 : 0;
  flags[n + group.rank()] = lacking_base ? 1 : 0;
  auto flags_dev = flags.to(device);
  group.all_reduce_sum(flags_dev);
  flags = flags_dev.cpu();
  rank_flags out;
  for (int r = 0; r < n; ++r) {
    if (flags[r].item<int64_t>() != 0)
      out.rejected.push_back(r);
    if (flags[n + r].item<int64_t>() != 0)
      out.lacking_base.push_back(r);
  }
  return out;
}

// Packs bucket `b` of `sources` into `dst` (b.bytes long).
void pack_bucket(const weight_bucket& b, const named_tensors& sources, const at::Tensor& dst) {
  for (const auto& t : b.tensors)
    if (t.bytes > 0)
      dst.narrow(0, static_cast<int64_t>(t.offset - b.offset), static_cast<int64_t>(t.bytes))
          .copy_(byte_view(sources[t.index].second, t.bytes));
}

const std::uint8_t* bytes_of(const at::Tensor& t) {
  return static_cast<const std::uint8_t*>(t.data_ptr());
}

std::uint8_t* bytes_of(at::Tensor& t) {
  return static_cast<std::uint8_t*>(t.data_ptr());
}

// The buckets that carry bytes.
std::vector<const weight_bucket*> nonempty_buckets(const bucket_plan& plan) {
  std::vector<const weight_bucket*> out;
  for (const auto& b : plan.buckets)
    if (b.bytes > 0)
      out.push_back(&b);
  return out;
}

// Whether a receiver can take a delta against `base`: it holds that version in `live`, and
// every target still views its bytes there.
bool holds_base(const detail::receive_buffers& buffers, std::uint64_t base, std::uint64_t current,
                const bucket_plan& plan, const std::vector<at::Tensor>& targets,
                c10::Device device) {
  if (base == 0 || !device.is_cpu() || current != base || buffers.live_version != base
      || !buffers.live.defined()
      || static_cast<std::uint64_t>(buffers.live.numel()) < plan.total_bytes)
    return false;
  const auto* live = bytes_of(buffers.live);
  for (const auto& b : plan.buckets)
    for (const auto& t : b.tensors) {
      const auto& x = targets[t.index];
      if (t.bytes > 0 && (!x.is_contiguous() || bytes_of(x) != live + t.offset))
        return false;
    }
  return true;
}

// One more broadcast of a delta transfer: {delta or not, the encoded size of each bucket}.
std::vector<int64_t> broadcast_sizes(collective_group& group, int root, c10::Device device,
                                     std::vector<int64_t> sizes) {
  auto t = at::from_blob(sizes.data(), {static_cast<int64_t>(sizes.size())},
                         at::TensorOptions().dtype(at::kLong))
               .clone()
               .to(device);
  group.broadcast(t, root);
  t = t.cpu().contiguous();
  const auto* p = t.data_ptr<int64_t>();
  return {p, p + t.numel()};
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

transfer_stats collective_send(collective_group& group, int root, c10::Device device,
                               std::uint64_t bucket_bytes, at::Tensor& bucket_buffer,
                               const named_tensors& weights, std::uint64_t version,
                               const char* who, sent_layout* sent) {
  c10::NoGradGuard no_grad;
  named_tensors sources;
  weight_manifest manifest;
  bucket_plan plan;
  std::string header;
  std::uint64_t base = 0; // the version a delta may build on
  try {
    if (sent && !device.is_cpu())
      fail(error_code::unsupported, std::string(who) + ": delta transfers are CPU only");
    sources = sender_sources(weights, version, device, who);
    manifest = make_manifest(sources);
    plan = make_bucket_plan(manifest, bucket_bytes);
    if (sent && sent->version != 0 && same_layout(sent->manifest, manifest))
      base = sent->version;
    header = encode_transfer_header(manifest, version, bucket_bytes, base);
  } catch (const error& e) {
    // Tell the receivers why nothing comes, then fail here too.
    broadcast_text(group, root, device, header_abort, e.what());
    throw;
  }
  broadcast_text(group, root, device, header_transfer, header);
  auto flags = gather_flags(group, device, false, false);
  if (!flags.rejected.empty())
    fail(error_code::invalid_argument,
         std::string(who) + ": weight transfer of version " + std::to_string(version) +
             " rejected by rank(s) " + rank_list(flags.rejected) +
             " (their errors name the tensors); no receiver changed its weights");
  const auto to_send = nonempty_buckets(plan);
  transfer_stats stats;
  stats.payload_bytes = manifest.total_bytes();
  if (sent) {
    // The copy is rewritten below: until this transfer commits it holds no version.
    sent->version = 0;
    if (!sent->bytes.defined() || static_cast<std::uint64_t>(sent->bytes.numel()) < plan.total_bytes)
      sent->bytes = at::empty({static_cast<int64_t>(plan.total_bytes)}, bytes_on(device));
  }
  // Delta: every receiver holds the base. Count the changes of every tensor, then tell the
  // receivers whether the buckets come encoded and how large each is.
  std::vector<std::vector<delta_choice>> choices;
  std::vector<int64_t> encoded;
  auto delta_tensors = [&](const weight_bucket& b) {
    std::vector<delta_tensor> out;
    for (const auto& t : b.tensors)
      out.push_back({bytes_of(sent->bytes) + t.offset, bytes_of(sources[t.index].second),
                     t.bytes, c10::elementSize(manifest.tensors[t.index].dtype)});
    return out;
  };
  if (base != 0 && flags.lacking_base.empty()) {
    std::vector<int64_t> sizes{0};
    std::uint64_t total = 0, changed = 0;
    for (const auto* b : to_send) {
      choices.emplace_back();
      for (const auto& d : delta_tensors(*b)) {
        choices.back().push_back(choose_delta(d));
        changed += choices.back().back().changed;
      }
      sizes.push_back(static_cast<int64_t>(delta_bucket_bytes(choices.back())));
      total += static_cast<std::uint64_t>(sizes.back());
    }
    sizes[0] = total < stats.payload_bytes ? 1 : 0;
    broadcast_sizes(group, root, device, sizes);
    if (sizes[0] != 0) {
      encoded.assign(sizes.begin() + 1, sizes.end());
      stats.delta = true;
      stats.changed = changed;
    }
  }
  // Two-deep pipeline: bucket i is packed (or encoded) while bucket i-1 travels, in the two
  // halves of the bucket buffer in turn (the half bucket i-2 used is free once bucket i is
  // packed). A full bucket of one tensor goes straight from it; with a copy to keep, every full
  // bucket is packed into the copy and goes from there.
  int64_t half = 0;
  for (std::size_t i = 0; i < to_send.size(); ++i)
    if (stats.delta)
      half = std::max(half, encoded[i]);
    else if (!sent && to_send[i]->tensors.size() > 1)
      half = std::max(half, static_cast<int64_t>(to_send[i]->bytes));
  if (half > 0 && (!bucket_buffer.defined() || bucket_buffer.numel() < 2 * half))
    bucket_buffer = at::empty({2 * half}, bytes_on(device));
  group.broadcast_pipelined(
      to_send.size(),
      [&](std::size_t i) {
        const auto& b = *to_send[i];
        if (stats.delta) {
          auto slot = bucket_buffer.narrow(0, static_cast<int64_t>(i % 2) * half, encoded[i]);
          encode_delta_bucket(delta_tensors(b), choices[i], bytes_of(slot));
          pack_bucket(b, sources, sent->bytes.narrow(0, static_cast<int64_t>(b.offset),
                                                     static_cast<int64_t>(b.bytes)));
          stats.wire_bytes += static_cast<std::uint64_t>(encoded[i]);
          return slot;
        }
        stats.wire_bytes += b.bytes;
        if (sent) {
          auto out = sent->bytes.narrow(0, static_cast<int64_t>(b.offset),
                                        static_cast<int64_t>(b.bytes));
          pack_bucket(b, sources, out);
          return out;
        }
        if (b.tensors.size() == 1)
          return byte_view(sources[b.tensors.front().index].second, b.bytes);
        auto buf = bucket_buffer.narrow(0, static_cast<int64_t>(i % 2) * half,
                                        static_cast<int64_t>(b.bytes));
        pack_bucket(b, sources, buf);
        return buf;
      },
      root, 2);
  group.barrier();
  if (sent) {
    sent->version = version;
    sent->manifest = std::move(manifest);
  }
  return stats;
}

std::uint64_t collective_receive(collective_group& group, int root, c10::Device device,
                                 receive_buffers& buffers, const targets_for_manifest& targets_for,
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
  named_tensors targets;
  bucket_plan plan;
  std::vector<at::Tensor> dst;
  bool can_delta = false;
  std::optional<error> mine;
  try {
    h = decode_transfer_header(text);
    targets = targets_for(h.manifest);
    check_transfer(h.manifest, h.version, targets, version, device);
    plan = make_bucket_plan(h.manifest, h.bucket_bytes);
    dst = targets_in_manifest_order(h.manifest, targets);
    can_delta = holds_base(buffers, h.delta_base, version, plan, dst, device);
  } catch (const error& e) {
    mine.emplace(e.code(), std::string(who) + " (rank " + std::to_string(group.rank()) +
                               "): " + e.what());
  }
  auto flags = gather_flags(group, device, mine.has_value(),
                            !mine && h.delta_base != 0 && !can_delta);
  if (mine)
    throw *mine;
  if (!flags.rejected.empty())
    fail(error_code::invalid_argument,
         std::string(who) + " (rank " + std::to_string(group.rank()) + "): weight transfer of " +
             "version " + std::to_string(h.version) + " aborted because rank(s) " +
             rank_list(flags.rejected) + " rejected it; weights unchanged");
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
  const auto to_receive = nonempty_buckets(plan);
  // A delta transfer: the encoded size of each bucket, when the sender chose to encode.
  std::vector<int64_t> encoded;
  if (h.delta_base != 0 && flags.lacking_base.empty()) {
    auto sizes = broadcast_sizes(group, root, device,
                                 std::vector<int64_t>(to_receive.size() + 1, 0));
    if (sizes[0] != 0) {
      for (std::size_t i = 0; i < to_receive.size(); ++i) {
        const auto& b = *to_receive[i];
        const auto most = b.bytes + 8 * b.tensors.size(); // full sections + the directory
        if (sizes[i + 1] < 0 || static_cast<std::uint64_t>(sizes[i + 1]) > most)
          fail(error_code::decode_error, std::string(who) + ": delta bucket " +
                                             std::to_string(i) + " claims " +
                                             std::to_string(sizes[i + 1]) + " bytes");
      }
      encoded.assign(sizes.begin() + 1, sizes.end());
    }
  }
  if (!encoded.empty()) {
    // Bucket i arrives in one half of the encoded buffer while bucket i-1 arrives in the other;
    // bucket i-2 is decoded into staging (over the live bytes) when bucket i is posted.
    const int64_t half = *std::max_element(encoded.begin(), encoded.end());
    if (!buffers.encoded.defined() || buffers.encoded.numel() < 2 * half)
      buffers.encoded = at::empty({2 * half}, bytes_on(device));
    auto slot = [&](std::size_t i) {
      return buffers.encoded.narrow(0, static_cast<int64_t>(i % 2) * half, encoded[i]);
    };
    auto decode = [&](std::size_t i) {
      std::vector<delta_target> out;
      for (const auto& t : to_receive[i]->tensors)
        out.push_back({bytes_of(buffers.live) + t.offset, bytes_of(staging) + t.offset, t.bytes,
                       c10::elementSize(h.manifest.tensors[t.index].dtype)});
      auto in = slot(i);
      decode_delta_bucket(bytes_of(in), static_cast<std::uint64_t>(encoded[i]), out);
    };
    group.broadcast_pipelined(
        to_receive.size(),
        [&](std::size_t i) {
          if (i >= 2)
            decode(i - 2);
          return slot(i);
        },
        root, 2);
    for (std::size_t i = to_receive.size() >= 2 ? to_receive.size() - 2 : 0;
         i < to_receive.size(); ++i)
      decode(i);
  } else {
    // The same pipeline as the sender's: the next bucket's receive is posted while one arrives.
    group.broadcast_pipelined(
        to_receive.size(),
        [&](std::size_t i) {
          return staging.narrow(0, static_cast<int64_t>(to_receive[i]->offset),
                                static_cast<int64_t>(to_receive[i]->bytes));
        },
        root, 2);
  }
  // Every bucket arrived: commit. A target takes its bytes of the staging buffer as its storage
  // (no copy) when it is contiguous, on `device`, and its offset is a multiple of its element
  // size; any other is copied into. The buffer the targets viewed before becomes the next
  // staging buffer.
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
  buffers.live_version = h.version;
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
  last_ = detail::collective_send(group_, root_, c10::Device(c10::kCPU), opts_.bucket_bytes,
                                  bucket_buffer_, weights, version, "gloo sender",
                                  delta_ ? &sent_ : nullptr);
}

void gloo_sender::set_delta(bool on) {
  delta_ = on;
  if (!on)
    sent_ = detail::sent_layout{};
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
  return receive_for([&](const weight_manifest&) { return targets; });
}

std::uint64_t gloo_receiver::receive_for(const targets_for_manifest& targets_for) {
  return detail::collective_receive(group_, root_, c10::Device(c10::kCPU), buffers_, targets_for,
                                    version_, "gloo receiver");
}

} // namespace rlforge::backends

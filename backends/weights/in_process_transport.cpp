#include "backends/weights/in_process_transport.hpp"
#include "backends/exception_text.hpp"

#include <condition_variable>
#include <map>
#include <cstring>
#include <mutex>
#include <optional>

namespace rlforge::backends {

namespace {

std::string ms(std::chrono::milliseconds x) {
  return std::to_string(x.count()) + " ms";
}

} // namespace

// One transfer at a time moves through idle -> posted -> taken -> done -> idle. The sender
// owns the transfer's lifetime: it waits in post_and_wait until the receiver is done with the
// source tensors.
struct in_process_channel::impl {
  enum class state { idle, posted, taken, done };

  transport_options opts;
  std::mutex mutex;
  std::condition_variable changed;
  state st = state::idle;
  std::optional<transfer> current;
  outcome result;
};

in_process_channel::in_process_channel(transport_options opts) : impl_(std::make_unique<impl>()) {
  validate(opts, "in-process channel");
  impl_->opts = opts;
}

in_process_channel::~in_process_channel() = default;

const transport_options& in_process_channel::options() const noexcept {
  return impl_->opts;
}

in_process_channel::outcome in_process_channel::post_and_wait(transfer t) {
  auto& p = *impl_;
  std::unique_lock<std::mutex> lock(p.mutex);
  auto deadline = std::chrono::steady_clock::now() + p.opts.timeout;
  if (!p.changed.wait_until(lock, deadline, [&] { return p.st == impl::state::idle; }))
    fail(error_code::timeout, "in-process sender: another transfer still occupied the channel "
                              "after " + ms(p.opts.timeout));
  auto version = t.version;
  p.current = std::move(t);
  p.st = impl::state::posted;
  p.changed.notify_all();
  if (!p.changed.wait_until(lock, deadline, [&] { return p.st != impl::state::posted; })) {
    p.current.reset();
    p.st = impl::state::idle;
    p.changed.notify_all();
    fail(error_code::timeout, "in-process sender: no receiver took version " +
                                  std::to_string(version) + " within " + ms(p.opts.timeout) +
                                  " (is the engine calling receive?)");
  }
  // Taken: the receiver is copying from our tensors; it always completes (the copy cannot
  // fail), so this wait needs no bound.
  p.changed.wait(lock, [&] { return p.st == impl::state::done; });
  auto out = std::move(p.result);
  p.current.reset();
  p.st = impl::state::idle;
  p.changed.notify_all();
  return out;
}

const in_process_channel::transfer& in_process_channel::take() {
  auto& p = *impl_;
  std::unique_lock<std::mutex> lock(p.mutex);
  if (!p.changed.wait_for(lock, p.opts.timeout, [&] { return p.st == impl::state::posted; }))
    fail(error_code::timeout, "in-process receiver: no transfer arrived within " +
                                  ms(p.opts.timeout) + " (is the trainer calling send?)");
  p.st = impl::state::taken;
  p.changed.notify_all();
  return *p.current;
}

void in_process_channel::complete(outcome o) {
  auto& p = *impl_;
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.st != impl::state::taken)
    fail(error_code::internal, "in-process channel: complete() without a taken transfer");
  p.result = std::move(o);
  p.st = impl::state::done;
  p.changed.notify_all();
}

// -- endpoints ---------------------------------------------------------------------------------

in_process_sender::in_process_sender(std::shared_ptr<in_process_channel> channel)
    : channel_(std::move(channel)) {
  if (!channel_)
    fail(error_code::invalid_argument, "in-process sender: channel is null");
}

void in_process_sender::send(const named_tensors& weights, std::uint64_t version) {
  in_process_channel::transfer t;
  t.sources = detail::sender_sources(weights, version, c10::Device(c10::kCPU),
                                     "in-process sender");
  t.manifest = make_manifest(t.sources);
  t.version = version;
  auto o = channel_->post_and_wait(std::move(t));
  if (!o.committed)
    detail::throw_outcome(o, "in-process sender");
}

in_process_receiver::in_process_receiver(std::shared_ptr<in_process_channel> channel)
    : channel_(std::move(channel)) {
  if (!channel_)
    fail(error_code::invalid_argument, "in-process receiver: channel is null");
}

std::uint64_t in_process_receiver::receive(const named_tensors& targets) {
  const auto& t = channel_->take();
  in_process_channel::outcome o;
  o.version = version_;
  try {
    check_transfer(t.manifest, t.version, targets, version_);
    detail::copy_transfer(t, targets, channel_->options().bucket_bytes);
  } catch (const error& e) {
    o.code = e.code();
    o.message = e.what();
    channel_->complete(std::move(o));
    throw;
  } catch (const std::exception& e) {
    o.code = error_code::internal;
    o.message = exception_first_line(e);
    channel_->complete(std::move(o));
    throw;
  }
  version_ = t.version;
  o.committed = true;
  o.version = version_;
  channel_->complete(std::move(o));
  return version_;
}

namespace detail {

void throw_outcome(const in_process_channel::outcome& o, const char* who) {
  fail(o.code, std::string(who) + ": the receiver did not commit: " + o.message);
}

void copy_transfer(const in_process_channel::transfer& t, const named_tensors& targets,
                   std::uint64_t bucket_bytes) {
  auto plan = make_bucket_plan(t.manifest, bucket_bytes);
  auto dst = targets_in_manifest_order(t.manifest, targets);
  for (const auto& b : plan.buckets)
    for (const auto& p : b.tensors)
      if (p.bytes > 0)
        std::memcpy(dst[p.index].data_ptr(), t.sources[p.index].second.data_ptr(), p.bytes);
}

} // namespace detail

std::shared_ptr<in_process_channel> named_in_process_channel(const std::string& name,
                                                             transport_options opts) {
  if (name.empty())
    fail(error_code::invalid_argument, "in-process channel: the name must not be empty");
  validate(opts, "in-process channel");
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<in_process_channel>> channels;
  std::lock_guard<std::mutex> guard{mutex};
  for (auto i = channels.begin(); i != channels.end();)
    i = i->second.expired() ? channels.erase(i) : std::next(i);
  auto& slot = channels[name];
  if (auto live = slot.lock())
    return live;
  auto fresh = std::make_shared<in_process_channel>(opts);
  slot = fresh;
  return fresh;
}

} // namespace rlforge::backends

#include "backends/weights/cuda_ipc_transport.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backends/error.hpp"

#ifdef RLFORGE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace rlforge::backends {

namespace {

void check_endpoint(const std::shared_ptr<shm_link>& link, const c10::Device& device,
                    const transport_options& opts, const char* who) {
#ifndef RLFORGE_WITH_CUDA
  (void)link;
  (void)opts;
  fail(error_code::unsupported, std::string(who) + ": " + device.str() +
                                    ": this rlforge was built without CUDA (RLFORGE_CUDA=OFF)");
#else
  if (!link)
    fail(error_code::invalid_argument, std::string(who) + ": the link is null");
  if (!device.is_cuda() || device.index() < 0)
    fail(error_code::invalid_argument,
         std::string(who) + ": the device must be a CUDA device with an index, got " + device.str());
  validate(opts, who);
#endif
}

#ifdef RLFORGE_WITH_CUDA
void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    cudaGetLastError(); // clear the sticky-free error state of this call
    fail(error_code::backend_error, what + ": " + cudaGetErrorString(status));
  }
}

std::string to_hex(const void* data, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

cudaIpcMemHandle_t from_hex(const std::string& hex) {
  cudaIpcMemHandle_t h{};
  if (hex.size() != 2 * sizeof h)
    fail(error_code::decode_error, "cuda_ipc receiver: a memory handle has " +
                                       std::to_string(hex.size()) + " hex digits, expected " +
                                       std::to_string(2 * sizeof h));
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    fail(error_code::decode_error, "cuda_ipc receiver: a memory handle is not hex");
  };
  auto* p = reinterpret_cast<unsigned char*>(&h);
  for (std::size_t i = 0; i < sizeof h; ++i)
    p[i] = static_cast<unsigned char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return h;
}
#endif

} // namespace

cuda_ipc_sender::cuda_ipc_sender(std::shared_ptr<shm_link> link, c10::Device device,
                                 transport_options opts)
    : link_(std::move(link)), device_(device), opts_(opts) {
  check_endpoint(link_, device_, opts_, "cuda_ipc sender");
}

void cuda_ipc_sender::send(const named_tensors& weights, std::uint64_t version) {
#ifdef RLFORGE_WITH_CUDA
  const char* who = "cuda_ipc sender";
  auto sources = detail::sender_sources(weights, version, device_, who);
  auto manifest = make_manifest(sources);
  c10::cuda::CUDAGuard guard(device_);
  // The receiver reads what the device holds once the queued work is done.
  c10::cuda::device_synchronize();
  nlohmann::json handles = nlohmann::json::array(), places = nlohmann::json::array();
  std::map<void*, std::size_t> index_of_base;
  for (const auto& [name, t] : sources) {
    if (t.numel() == 0) {
      places.push_back({-1, 0});
      continue;
    }
    void* ptr = t.data_ptr();
    std::size_t segment = 0;
    void* base = c10::cuda::CUDACachingAllocator::getBaseAllocation(ptr, &segment);
    if (base == nullptr)
      fail(error_code::invalid_argument, std::string(who) + ": tensor '" + name +
                                             "' is not memory of the CUDA caching allocator");
    auto found = index_of_base.find(base);
    if (found == index_of_base.end()) {
      cudaIpcMemHandle_t h{};
      check_cuda(cudaIpcGetMemHandle(&h, base),
                 std::string(who) + ": cannot export the memory of tensor '" + name + "'");
      found = index_of_base.emplace(base, handles.size()).first;
      handles.push_back(to_hex(&h, sizeof h));
    }
    places.push_back({found->second, static_cast<char*>(ptr) - static_cast<char*>(base)});
  }
  shm_descriptor d;
  d.version = version;
  d.data_bytes = manifest.total_bytes();
  d.header = encode_transfer_header(manifest, version, opts_.bucket_bytes);
  d.cuda_ipc =
      nlohmann::json{{"device", device_.index()}, {"handles", handles}, {"tensors", places}}.dump();
  link_->post_descriptor(d);
  auto outcome = link_->wait_outcome(opts_.timeout);
  if (!outcome.committed)
    fail(outcome.code, std::string(who) + ": the receiver did not take version " +
                           std::to_string(version) + ": " + outcome.message);
#else
  (void)weights;
  (void)version;
  fail(error_code::unsupported, "cuda_ipc sender: built without CUDA");
#endif
}

cuda_ipc_receiver::cuda_ipc_receiver(std::shared_ptr<shm_link> link, c10::Device device,
                                     transport_options opts)
    : link_(std::move(link)), device_(device), opts_(opts) {
  check_endpoint(link_, device_, opts_, "cuda_ipc receiver");
}

cuda_ipc_receiver::~cuda_ipc_receiver() {
  close_unused({});
}

void cuda_ipc_receiver::close_unused(const std::map<std::string, void*>& keep) noexcept {
#ifdef RLFORGE_WITH_CUDA
  for (auto i = opened_.begin(); i != opened_.end();) {
    if (keep.count(i->first)) {
      ++i;
      continue;
    }
    cudaIpcCloseMemHandle(i->second);
    i = opened_.erase(i);
  }
#else
  (void)keep;
#endif
}

std::uint64_t cuda_ipc_receiver::receive(const named_tensors& targets) {
#ifdef RLFORGE_WITH_CUDA
  const char* who = "cuda_ipc receiver";
  auto d = link_->wait_descriptor(opts_.timeout);
  auto refuse = [&](error_code code, const std::string& message) {
    link_->post_outcome({false, code, message, version_});
    fail(code, message);
  };
  if (d.cuda_ipc.empty())
    refuse(error_code::invalid_argument,
           std::string(who) + ": the sender posted a host shared-memory transfer ('" + d.name +
               "'), not a CUDA IPC one");
  transfer_header header;
  nlohmann::json ipc;
  try {
    header = decode_transfer_header(d.header);
    ipc = nlohmann::json::parse(d.cuda_ipc);
    check_transfer(header.manifest, header.version, targets, version_, device_);
    if (ipc.at("tensors").size() != header.manifest.tensors.size())
      fail(error_code::decode_error, std::string(who) + ": the descriptor places " +
                                         std::to_string(ipc.at("tensors").size()) +
                                         " tensors, the manifest has " +
                                         std::to_string(header.manifest.tensors.size()));
  } catch (const error& e) {
    refuse(e.code(), e.what());
  } catch (const nlohmann::json::exception& e) {
    refuse(error_code::decode_error, std::string(who) + ": malformed descriptor: " + e.what());
  }
  c10::cuda::CUDAGuard guard(device_);
  // Every handle open before a byte moves: a handle that fails leaves the weights as they were.
  std::vector<void*> bases;
  std::map<std::string, void*> now;
  try {
    for (const auto& h : ipc.at("handles")) {
      const auto hex = h.get<std::string>();
      auto it = opened_.find(hex);
      void* base = nullptr;
      if (it != opened_.end()) {
        base = it->second;
      } else {
        check_cuda(cudaIpcOpenMemHandle(&base, from_hex(hex), cudaIpcMemLazyEnablePeerAccess),
                   std::string(who) + ": cannot open a memory handle of the sender (device " +
                       std::to_string(ipc.at("device").get<int>()) + ")");
        opened_.emplace(hex, base);
      }
      now.emplace(hex, base);
      bases.push_back(base);
    }
  } catch (const error& e) {
    refuse(e.code(), e.what());
  } catch (const nlohmann::json::exception& e) {
    refuse(error_code::decode_error, std::string(who) + ": malformed descriptor: " + e.what());
  }
  close_unused(now);
  auto ordered = detail::targets_in_manifest_order(header.manifest, targets);
  try {
    c10::NoGradGuard no_grad;
    const auto& places = ipc.at("tensors");
    for (std::size_t i = 0; i < ordered.size(); ++i) {
      const auto& spec = header.manifest.tensors[i];
      const auto handle = places[i].at(0).get<int64_t>();
      if (spec.bytes == 0 || handle < 0)
        continue;
      auto* src = static_cast<char*>(bases.at(static_cast<std::size_t>(handle))) +
                  places[i].at(1).get<int64_t>();
      auto view = at::from_blob(src, spec.shape,
                                at::TensorOptions().dtype(spec.dtype).device(device_));
      ordered[i].copy_(view);
    }
    c10::cuda::device_synchronize();
  } catch (const std::exception& e) {
    // Some targets may hold the new values: no coherent version is held.
    version_ = 0;
    auto message = std::string(who) + ": copying version " + std::to_string(header.version) +
                   " failed: " + e.what();
    link_->post_outcome({false, error_code::backend_error, message, version_});
    fail(error_code::backend_error, message);
  }
  version_ = header.version;
  link_->post_outcome({true, error_code::internal, "", version_});
  return version_;
#else
  (void)targets;
  fail(error_code::unsupported, "cuda_ipc receiver: built without CUDA");
#endif
}

} // namespace rlforge::backends

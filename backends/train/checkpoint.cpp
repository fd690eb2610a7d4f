#include "backends/train/checkpoint.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "backends/error.hpp"
#include "backends/model/safetensors.hpp"
#include "backends/train/detail.hpp"

namespace rlforge::backends {

namespace fs = std::filesystem;

namespace {

constexpr const char* engine_prefix = "std_engine.";

using detail::in_quotes;

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

std::string read_text(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail(error_code::not_found, "checkpoint: missing file " + in_quotes(path));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(error_code::io_error,
         "checkpoint: cannot open " + in_quotes(path) + ": " + std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad())
    fail(error_code::io_error, "checkpoint: reading " + in_quotes(path) + " failed");
  return out.str();
}

nlohmann::json read_json(const std::string& path) {
  auto text = read_text(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(error_code::decode_error,
         "checkpoint: " + in_quotes(path) + " is not valid JSON: " + e.what());
  }
}

// A typed field of a JSON object read from `path`; missing or ill-typed → decode_error.
template <class T>
T json_field(const nlohmann::json& j, const char* name, const std::string& path) {
  if (!j.is_object() || !j.contains(name))
    fail(error_code::decode_error,
         "checkpoint: " + in_quotes(path) + " lacks the field '" + std::string(name) + "'");
  const auto& v = j.at(name);
  if (!detail::json_holds<T>(v))
    fail(error_code::decode_error, "checkpoint: " + in_quotes(path) + ": field '" + name +
                                       "' has the wrong type (" + v.dump() + ")");
  return v.get<T>();
}

void make_directories(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    fail(error_code::io_error,
         "checkpoint: cannot create directory " + in_quotes(dir) + ": " + ec.message());
}

nlohmann::json to_json(const adam_params& p) {
  return nlohmann::json{{"learning_rate", p.learning_rate},
                        {"beta1", p.beta1},
                        {"beta2", p.beta2},
                        {"eps", p.eps},
                        {"weight_decay", p.weight_decay},
                        {"grad_clip_norm", p.grad_clip_norm}};
}

adam_params adam_params_from_json(const nlohmann::json& j, const std::string& path) {
  adam_params p;
  p.learning_rate = json_field<double>(j, "learning_rate", path);
  p.beta1 = json_field<double>(j, "beta1", path);
  p.beta2 = json_field<double>(j, "beta2", path);
  p.eps = json_field<double>(j, "eps", path);
  p.weight_decay = json_field<double>(j, "weight_decay", path);
  p.grad_clip_norm = json_field<double>(j, "grad_clip_norm", path);
  return p;
}

// Prefixes an error from `f` with `context`, keeping its code.
template <class F> auto in_context(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const error& e) {
    fail(e.code(), context + ": " + e.what());
  }
}

// decode_error unless `j` (read from `path`) has this build's "format_version"; the message
// starts with `subject`.
void check_format_version(const nlohmann::json& j, const std::string& path,
                          const std::string& subject) {
  auto version = json_field<int64_t>(j, "format_version", path);
  if (version != checkpoint_format_version)
    fail(error_code::decode_error, subject + " has format version " + std::to_string(version) +
                                       ", this build reads " +
                                       std::to_string(checkpoint_format_version));
}

void check_meta(const checkpoint_location& where, const std::string& dir,
                const std::string& meta_path) {
  auto meta = read_json(meta_path);
  check_format_version(meta, meta_path, "checkpoint " + in_quotes(dir));
  auto world_size = json_field<int64_t>(meta, "world_size", meta_path);
  if (world_size != where.world_size)
    fail(error_code::invalid_argument,
         "checkpoint " + in_quotes(dir) + " was saved with world size " +
             std::to_string(world_size) + ", this group has " + std::to_string(where.world_size));
  auto rank = json_field<int64_t>(meta, "rank", meta_path);
  auto role = json_field<std::string>(meta, "role", meta_path);
  auto step = json_field<int64_t>(meta, "global_step", meta_path);
  if (rank != where.rank || role != where.role || step != where.global_step)
    fail(error_code::invalid_argument,
         "checkpoint " + in_quotes(meta_path) + " describes role " + in_quotes(role) + " rank " +
             std::to_string(rank) + " step " + std::to_string(step) + ", expected role " +
             in_quotes(where.role) + " rank " + std::to_string(where.rank) + " step " +
             std::to_string(where.global_step));
}

} // namespace

void checkpoint_location::validate() const {
  if (root.empty())
    fail(error_code::invalid_argument, "checkpoint: root directory is empty");
  if (global_step < 0)
    fail(error_code::invalid_argument,
         "checkpoint: global_step " + std::to_string(global_step) + " is negative");
  if (role.empty() || role == "." || role == ".." || role.find('/') != std::string::npos)
    fail(error_code::invalid_argument,
         "checkpoint: role " + in_quotes(role) + " must be one non-empty path component");
  if (world_size < 1)
    fail(error_code::invalid_argument,
         "checkpoint: world_size " + std::to_string(world_size) + " must be >= 1");
  if (rank < 0 || rank >= world_size)
    fail(error_code::invalid_argument, "checkpoint: rank " + std::to_string(rank) +
                                           " outside [0, " + std::to_string(world_size) + ")");
}

std::string step_directory(const std::string& root, int64_t global_step) {
  return join(root, "global_step_" + std::to_string(global_step));
}

std::string rank_directory(const checkpoint_location& where) {
  return join(join(step_directory(where.root, where.global_step), where.role),
              "rank_" + std::to_string(where.rank));
}

void save_rank_state(const checkpoint_location& where, const named_parameters& model,
                     const adamw& optimizer, const lr_schedule* scheduler, const rng_state& rng) {
  where.validate();
  std::map<std::string, at::Tensor> weights;
  for (const auto& [name, p] : model) {
    if (!p.defined())
      fail(error_code::invalid_argument,
           "checkpoint: parameter " + in_quotes(name) + " is undefined");
    if (!weights.emplace(name, p.detach()).second)
      fail(error_code::invalid_argument,
           "checkpoint: parameter " + in_quotes(name) + " appears twice");
  }
  const auto dir = rank_directory(where);
  make_directories(dir);

  write_safetensors(join(dir, "model.safetensors"), weights);

  auto opt = optimizer.state();
  std::map<std::string, at::Tensor> moments;
  nlohmann::json steps = nlohmann::json::object();
  for (const auto& [name, s] : opt.params) {
    moments[name + ".exp_avg"] = s.exp_avg;
    moments[name + ".exp_avg_sq"] = s.exp_avg_sq;
    steps[name] = s.step;
  }
  write_safetensors(join(dir, "optimizer.safetensors"), moments);
  nlohmann::json opt_json{{"format_version", checkpoint_format_version},
                          {"steps", steps},
                          {"last_params", to_json(opt.last_params)}};
  write_file_atomically(join(dir, "optimizer.json"), opt_json.dump(2) + "\n");

  nlohmann::json sched = scheduler ? scheduler->to_json() : nlohmann::json();
  write_file_atomically(join(dir, "scheduler.json"), sched.dump(2) + "\n");

  std::map<std::string, std::string> rng_meta;
  for (const auto& [name, text] : rng.std_engines)
    rng_meta[engine_prefix + name] = text;
  auto torch_bytes = at::empty({static_cast<int64_t>(rng.torch_cpu.size())}, at::kByte);
  if (!rng.torch_cpu.empty())
    std::memcpy(torch_bytes.data_ptr<uint8_t>(), rng.torch_cpu.data(), rng.torch_cpu.size());
  write_safetensors(join(dir, "rng.safetensors"), {{"torch_cpu", torch_bytes}}, rng_meta);

  nlohmann::json meta{{"format_version", checkpoint_format_version},
                      {"world_size", where.world_size},
                      {"rank", where.rank},
                      {"role", where.role},
                      {"global_step", where.global_step}};
  write_file_atomically(join(dir, "meta.json"), meta.dump(2) + "\n");
}

rank_checkpoint load_rank_state(const checkpoint_location& where) {
  where.validate();
  const auto dir = rank_directory(where);
  const auto meta_path = join(dir, "meta.json");
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) {
    // A rank that did not exist in the saving group: say so if rank 0 tells the world size.
    checkpoint_location rank0 = where;
    rank0.rank = 0;
    auto rank0_meta = join(rank_directory(rank0), "meta.json");
    if (where.rank != 0 && fs::exists(rank0_meta, ec)) {
      auto meta = read_json(rank0_meta);
      auto world_size = json_field<int64_t>(meta, "world_size", rank0_meta);
      if (world_size != where.world_size)
        fail(error_code::invalid_argument,
             "checkpoint " +
                 in_quotes(join(step_directory(where.root, where.global_step), where.role)) +
                 " was saved with world size " + std::to_string(world_size) + ", this group has " +
                 std::to_string(where.world_size));
    }
    fail(error_code::not_found, "checkpoint: missing file " + in_quotes(meta_path) +
                                    " (no complete state for role " + in_quotes(where.role) +
                                    " rank " + std::to_string(where.rank) + " at step " +
                                    std::to_string(where.global_step) + ")");
  }
  check_meta(where, dir, meta_path);

  rank_checkpoint out;
  out.model = read_safetensors(join(dir, "model.safetensors"));

  const auto opt_path = join(dir, "optimizer.json");
  auto opt_json = read_json(opt_path);
  if (!opt_json.is_object() || !opt_json.contains("steps") || !opt_json.at("steps").is_object())
    fail(error_code::decode_error,
         "checkpoint: " + in_quotes(opt_path) + " lacks the object 'steps'");
  if (!opt_json.contains("last_params"))
    fail(error_code::decode_error,
         "checkpoint: " + in_quotes(opt_path) + " lacks the field 'last_params'");
  out.optimizer.last_params = adam_params_from_json(opt_json.at("last_params"), opt_path);
  const auto moments_path = join(dir, "optimizer.safetensors");
  auto moments = read_safetensors(moments_path);
  size_t used = 0;
  for (const auto& [name, step] : opt_json.at("steps").items()) {
    if (!step.is_number_integer())
      fail(error_code::decode_error, "checkpoint: " + in_quotes(opt_path) + ": step of " +
                                         in_quotes(name) + " is not an integer");
    adamw_param_state s;
    s.step = step.get<int64_t>();
    for (const char* which : {".exp_avg", ".exp_avg_sq"}) {
      auto it = moments.find(name + which);
      if (it == moments.end())
        fail(error_code::decode_error,
             "checkpoint: " + in_quotes(moments_path) + " lacks tensor " + in_quotes(name + which));
      (std::string(which) == ".exp_avg" ? s.exp_avg : s.exp_avg_sq) = it->second;
      ++used;
    }
    out.optimizer.params[name] = std::move(s);
  }
  if (used != moments.size())
    fail(error_code::decode_error, "checkpoint: " + in_quotes(moments_path) + " holds " +
                                       std::to_string(moments.size() - used) + " tensors that " +
                                       in_quotes(opt_path) + " does not list");
  // Checked here so a bad file is reported at load time, naming it.
  in_context("checkpoint " + in_quotes(opt_path), [&] { validate(out.optimizer); });

  const auto sched_path = join(dir, "scheduler.json");
  auto sched = read_json(sched_path);
  if (!sched.is_null())
    out.scheduler = in_context("checkpoint " + in_quotes(sched_path),
                               [&] { return lr_schedule::from_json(sched); });

  const auto rng_path = join(dir, "rng.safetensors");
  auto rng_file = read_safetensors_file(rng_path);
  auto torch_it = rng_file.tensors.find("torch_cpu");
  if (torch_it == rng_file.tensors.end() || torch_it->second.scalar_type() != at::kByte ||
      torch_it->second.dim() != 1)
    fail(error_code::decode_error,
         "checkpoint: " + in_quotes(rng_path) + " lacks the 1-D uint8 tensor 'torch_cpu'");
  auto bytes = torch_it->second.contiguous();
  out.rng.torch_cpu.resize(static_cast<size_t>(bytes.numel()));
  if (!out.rng.torch_cpu.empty())
    std::memcpy(out.rng.torch_cpu.data(), bytes.data_ptr<uint8_t>(), out.rng.torch_cpu.size());
  const std::string prefix = engine_prefix;
  for (const auto& [key, text] : rng_file.metadata)
    if (key.compare(0, prefix.size(), prefix) == 0)
      out.rng.std_engines[key.substr(prefix.size())] = text;
  return out;
}

void load_parameters(const named_parameters& params,
                     const std::map<std::string, at::Tensor>& tensors) {
  std::set<std::string> names;
  for (const auto& [name, p] : params) {
    if (!p.defined())
      fail(error_code::invalid_argument,
           "load_parameters: parameter " + in_quotes(name) + " is undefined");
    if (!names.insert(name).second)
      fail(error_code::invalid_argument,
           "load_parameters: parameter " + in_quotes(name) + " appears twice");
    auto it = tensors.find(name);
    if (it == tensors.end())
      fail(error_code::invalid_argument,
           "load_parameters: no saved tensor for parameter " + in_quotes(name));
    const auto& t = it->second;
    if (!t.defined() || t.sizes() != p.sizes() || t.scalar_type() != p.scalar_type()) {
      std::ostringstream msg;
      msg << "load_parameters: saved tensor " << in_quotes(name) << " is ";
      if (t.defined())
        msg << c10::toString(t.scalar_type()) << t.sizes();
      else
        msg << "undefined";
      msg << ", the parameter is " << c10::toString(p.scalar_type()) << p.sizes();
      fail(error_code::invalid_argument, msg.str());
    }
  }
  for (const auto& [name, t] : tensors)
    if (names.count(name) == 0)
      fail(error_code::invalid_argument,
           "load_parameters: saved tensor " + in_quotes(name) + " matches no parameter");
  c10::NoGradGuard no_grad;
  for (const auto& [name, p] : params)
    at::Tensor(p).copy_(tensors.at(name));
}

rng_state restore_rank_state(const checkpoint_location& where, const named_parameters& model,
                             adamw& optimizer, lr_schedule* scheduler) {
  auto state = load_rank_state(where);
  const auto dir = rank_directory(where);
  if (scheduler && !state.scheduler)
    fail(error_code::invalid_argument,
         "checkpoint " + in_quotes(dir) + " holds no learning-rate schedule");
  in_context("checkpoint " + in_quotes(dir), [&] {
    load_parameters(model, state.model);
    optimizer.load_state(state.optimizer);
    if (scheduler)
      *scheduler = *state.scheduler;
    restore_rng_state(state.rng);
  });
  return state.rng;
}

void finalize_checkpoint(const std::string& root, int64_t global_step,
                         const nlohmann::json& state) {
  if (global_step < 0)
    fail(error_code::invalid_argument,
         "finalize_checkpoint: global_step " + std::to_string(global_step) + " is negative");
  if (!state.is_object())
    fail(error_code::invalid_argument,
         "finalize_checkpoint: trainer state must be a JSON object, got " +
             std::string(state.type_name()));
  const auto dir = step_directory(root, global_step);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(error_code::not_found, "finalize_checkpoint: no directory " + in_quotes(dir) +
                                    " (save every rank's state first)");
  auto full = state;
  full["global_step"] = global_step;
  full["format_version"] = checkpoint_format_version;
  write_file_atomically(join(dir, "trainer_state.json"), full.dump(2) + "\n");
  // Last: readers that find this file find a complete checkpoint behind it.
  write_file_atomically(join(root, "latest_global_step.txt"), std::to_string(global_step) + "\n");
}

nlohmann::json read_trainer_state(const std::string& root, int64_t global_step) {
  const auto path = join(step_directory(root, global_step), "trainer_state.json");
  auto j = read_json(path);
  check_format_version(j, path, "checkpoint: " + in_quotes(path));
  auto step = json_field<int64_t>(j, "global_step", path);
  if (step != global_step)
    fail(error_code::decode_error, "checkpoint: " + in_quotes(path) + " records global_step " +
                                       std::to_string(step) + ", expected " +
                                       std::to_string(global_step));
  return j;
}

std::optional<int64_t> latest_step(const std::string& root) {
  const auto path = join(root, "latest_global_step.txt");
  std::error_code ec;
  if (!fs::exists(path, ec))
    return std::nullopt;
  auto text = read_text(path);
  auto first = text.find_first_not_of(" \t\r\n");
  auto last = text.find_last_not_of(" \t\r\n");
  std::string digits = first == std::string::npos ? "" : text.substr(first, last - first + 1);
  bool ok = !digits.empty() && digits.size() <= 18 &&
            digits.find_first_not_of("0123456789") == std::string::npos;
  if (!ok)
    fail(error_code::decode_error,
         "checkpoint: " + in_quotes(path) +
             " does not hold a step number (contents: " + in_quotes(text.substr(0, 64)) + ")");
  int64_t step = std::stoll(digits);
  const auto dir = step_directory(root, step);
  if (!fs::is_directory(dir, ec))
    fail(error_code::not_found, "checkpoint: " + in_quotes(path) + " names step " +
                                    std::to_string(step) + " but " + in_quotes(dir) +
                                    " does not exist");
  return step;
}

} // namespace rlforge::backends

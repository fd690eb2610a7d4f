#include "examples/grpo/report.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace rlforge::examples::report {

namespace fs = std::filesystem;

namespace {

std::string fmt(const char* format, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, x);
  return buf;
}

void check_finite(const char* name, double x) {
  if (!std::isfinite(x))
    throw std::invalid_argument(std::string("step_stats: ") + name + " is not finite (" +
                                std::to_string(x) + ")");
}

void check_seconds(const char* name, double x) {
  check_finite(name, x);
  if (x < 0)
    throw std::invalid_argument(std::string("step_stats: ") + name + " is negative (" +
                                std::to_string(x) + ")");
}

/// A gnuplot single-quoted string: a quote is written twice.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "''";
    else
      out += c;
  }
  return out + "'";
}

/// The start of every plot script: checks that the output path is not empty and that neither
/// it nor the title holds a line break, then selects a 900x500 PNG at `png_path` titled `title`.
/// `noenhanced`: titles and key labels are drawn as written ("one_step_off", not subscripts).
/// Throws std::invalid_argument.
std::string plot_preamble(const std::string& png_path, const std::string& title) {
  if (png_path.empty())
    throw std::invalid_argument("plot: the output path is empty");
  for (const auto* s : {&png_path, &title})
    if (s->find_first_of("\n\r") != std::string::npos)
      throw std::invalid_argument("plot: '" + *s + "' holds a line break");
  return "set terminal pngcairo size 900,500 noenhanced font ',10'\nset output " +
         quoted(png_path) + "\nset title " + quoted(title) + "\n";
}

bool executable_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

} // namespace

double step_stats::tokens_per_second() const {
  return generate_seconds > 0 ? static_cast<double>(tokens) / generate_seconds : 0.0;
}

void validate(const step_stats& s) {
  if (s.step < 1)
    throw std::invalid_argument("step_stats: step must be >= 1, got " + std::to_string(s.step));
  if (s.total_steps < s.step)
    throw std::invalid_argument("step_stats: total_steps " + std::to_string(s.total_steps) +
                                " is below step " + std::to_string(s.step));
  if (s.tokens < 0)
    throw std::invalid_argument("step_stats: tokens is negative (" + std::to_string(s.tokens) +
                                ")");
  check_finite("reward", s.reward);
  check_finite("accuracy", s.accuracy);
  check_finite("loss", s.loss);
  check_finite("kl", s.kl);
  check_finite("entropy", s.entropy);
  check_finite("grad_norm", s.grad_norm);
  check_seconds("generate_seconds", s.generate_seconds);
  check_seconds("train_seconds", s.train_seconds);
  check_seconds("sync_seconds", s.sync_seconds);
}

std::string progress_line(const step_stats& s, int bar_width) {
  validate(s);
  if (bar_width < 1)
    throw std::invalid_argument("progress_line: bar_width must be >= 1, got " +
                                std::to_string(bar_width));
  auto filled = static_cast<int>(static_cast<int64_t>(bar_width) * s.step / s.total_steps);
  char head[64];
  auto width = std::to_string(s.total_steps).size();
  std::snprintf(head, sizeof(head), "step %*d/%d [", static_cast<int>(width), s.step,
                s.total_steps);
  std::string line = head;
  line += std::string(static_cast<size_t>(filled), '#');
  line += std::string(static_cast<size_t>(bar_width - filled), '-');
  line += "] reward " + fmt("%.3f", s.reward) + " loss " + fmt("%.4f", s.loss) + " kl " +
          fmt("%.4f", s.kl) + " tok/s " + fmt("%.0f", s.tokens_per_second()) + " | gen " +
          fmt("%.2f", s.generate_seconds) + "s train " + fmt("%.2f", s.train_seconds) +
          "s sync " + fmt("%.2f", s.sync_seconds) + "s";
  return line;
}

nlohmann::json to_json(const step_stats& s) {
  validate(s);
  return nlohmann::json{{"step", s.step},
                        {"total_steps", s.total_steps},
                        {"reward", s.reward},
                        {"accuracy", s.accuracy},
                        {"loss", s.loss},
                        {"kl", s.kl},
                        {"entropy", s.entropy},
                        {"grad_norm", s.grad_norm},
                        {"tokens", s.tokens},
                        {"tokens_per_second", s.tokens_per_second()},
                        {"generate_seconds", s.generate_seconds},
                        {"train_seconds", s.train_seconds},
                        {"sync_seconds", s.sync_seconds},
                        {"seconds", s.seconds()},
                        {"weight_version", s.weight_version}};
}

void count_staleness(std::vector<int64_t>& histogram, int64_t staleness) {
  if (staleness < 0)
    throw std::invalid_argument("staleness must be >= 0, got " + std::to_string(staleness));
  const auto k = static_cast<size_t>(staleness);
  if (histogram.size() <= k)
    histogram.resize(k + 1, 0);
  ++histogram[k];
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error("metrics file '" + path + "' cannot be read");
  std::vector<nlohmann::json> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty())
      continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error("metrics file '" + path + "' line " + std::to_string(n) +
                               " is not JSON: " + e.what());
    }
    if (!j.is_object())
      throw std::runtime_error("metrics file '" + path + "' line " + std::to_string(n) +
                               " is not a JSON object");
    for (auto key : {"step", "reward", "loss", "kl", "tokens_per_second", "generate_seconds",
                     "train_seconds", "sync_seconds"}) {
      if (!j.contains(key) || !j[key].is_number())
        throw std::runtime_error("metrics file '" + path + "' line " + std::to_string(n) +
                                 " has no numeric field '" + key + "'");
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::optional<std::string> find_program(const std::string& candidate) {
  if (candidate.empty())
    return std::nullopt;
  if (candidate.find('/') != std::string::npos)
    return executable_file(candidate) ? std::optional<std::string>(candidate) : std::nullopt;
  const char* path = std::getenv("PATH");
  if (!path)
    return std::nullopt;
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos)
      end = dirs.size();
    auto dir = dirs.substr(start, end - start);
    if (dir.empty())
      dir = ".";
    auto full = dir + "/" + candidate;
    if (executable_file(full))
      return full;
    start = end + 1;
  }
  return std::nullopt;
}

std::string plot_script(const plot_spec& spec) {
  if (spec.rewards.empty())
    throw std::invalid_argument("plot: no rewards to draw");
  for (size_t i = 0; i < spec.rewards.size(); ++i) {
    if (!std::isfinite(spec.rewards[i]))
      throw std::invalid_argument("plot: the reward of step " + std::to_string(i + 1) +
                                  " is not finite (" + std::to_string(spec.rewards[i]) + ")");
  }
  if (spec.smoothing < 1)
    throw std::invalid_argument("plot: smoothing must be >= 1, got " +
                                std::to_string(spec.smoothing));
  std::ostringstream g;
  g << plot_preamble(spec.png_path, spec.title)
    << "set xlabel 'step'\nset ylabel 'mean reward'\nset grid\nset key bottom right\n"
    << "set yrange [0:1.05]\n";
  if (spec.rewards.size() == 1)
    g << "set xrange [0.5:1.5]\n";
  g << "$rewards << EOD\n";
  // Running mean over the last `smoothing` steps (fewer at the start).
  double window_sum = 0;
  for (size_t i = 0; i < spec.rewards.size(); ++i) {
    window_sum += spec.rewards[i];
    auto w = static_cast<size_t>(spec.smoothing);
    if (i >= w)
      window_sum -= spec.rewards[i - w];
    auto n = static_cast<double>(std::min(i + 1, w));
    g << (i + 1) << ' ' << fmt("%.6f", spec.rewards[i]) << ' ' << fmt("%.6f", window_sum / n)
      << "\n";
  }
  g << "EOD\n"
    << "plot $rewards using 1:2 with linespoints pt 7 ps 0.4 lc rgb '#9bb7d4' title 'reward', \\\n"
    << "     $rewards using 1:3 with lines lw 2 lc rgb '#1f4e79' title 'running mean ("
    << spec.smoothing << " steps)'\n";
  return g.str();
}

std::string accuracy_plot_script(const std::vector<accuracy_curve>& curves,
                                 const std::string& png_path, const std::string& title) {
  if (curves.empty())
    throw std::invalid_argument("plot: no accuracy curves to draw");
  std::ostringstream g;
  g << plot_preamble(png_path, title)
    << "set xlabel 'wall seconds of GRPO'\nset ylabel 'held-out accuracy'\nset grid\n"
    // From 0 to a little above the highest accuracy: a task whose accuracy stays at a few
    // percent shows its curves, not a flat line at the bottom.
    << "set key bottom right\nset yrange [0:*]\nset offsets 0, 0, graph 0.1, 0\n";
  std::string plot = "plot ";
  for (size_t c = 0; c < curves.size(); ++c) {
    const auto& curve = curves[c];
    if (curve.points.empty())
      throw std::invalid_argument("plot: the curve '" + curve.label + "' has no points");
    if (curve.label.find_first_of("\n\r") != std::string::npos)
      throw std::invalid_argument("plot: '" + curve.label + "' holds a line break");
    g << "$c" << c << " << EOD\n";
    for (const auto& [t, a] : curve.points) {
      if (!std::isfinite(t) || !std::isfinite(a))
        throw std::invalid_argument("plot: a point of '" + curve.label + "' is not finite");
      g << fmt("%.3f", t) << ' ' << fmt("%.4f", a) << "\n";
    }
    g << "EOD\n";
    plot += std::string(c ? ", " : "") + "$c" + std::to_string(c) +
            " using 1:2 with linespoints pt 7 ps 0.6 lw 2 title " + quoted(curve.label);
  }
  g << plot << "\n";
  return g.str();
}

plot_result plot_reward_curve(const plot_spec& spec, const std::string& program) {
  return run_gnuplot(plot_script(spec), spec.png_path, program);
}

plot_result run_gnuplot(const std::string& script, const std::string& png_path,
                        const std::string& program) {
  plot_result res;
  auto exe = find_program(program);
  if (!exe) {
    res.message = "gnuplot not found" +
                  std::string(program.find('/') == std::string::npos ? " on PATH" : "") + " ('" +
                  program + "'); install gnuplot-nox (scripts/setup does) to get the plot";
    return res;
  }
  std::error_code ec;
  auto dir = fs::temp_directory_path(ec);
  if (ec)
    dir = ".";
  auto stem = "rlforge_plot_" + std::to_string(::getpid()) + "_" +
              std::to_string(reinterpret_cast<uintptr_t>(&script));
  auto script_path = dir / (stem + ".gp");
  auto log_path = dir / (stem + ".log");
  {
    std::ofstream out(script_path);
    out << script;
    if (!out) {
      res.message = "cannot write the gnuplot script '" + script_path.string() + "'";
      return res;
    }
  }
  fs::remove(png_path, ec);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::string arg0 = *exe, arg1 = script_path.string();
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, exe->c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    res.message = "cannot run '" + *exe + "': " + std::strerror(rc);
  } else {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    auto log = read_text(log_path);
    while (!log.empty() && (log.back() == '\n' || log.back() == ' '))
      log.pop_back();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      res.message = "'" + *exe + "' failed (" +
                    (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                       : std::string("killed by a signal")) +
                    ")" + (log.empty() ? "" : ": " + log);
    } else if (!is_png(png_path)) {
      res.message = "'" + *exe + "' ran but '" + png_path + "' is not a PNG" +
                    (log.empty() ? "" : ": " + log);
    } else {
      res.written = true;
    }
  }
  fs::remove(script_path, ec);
  fs::remove(log_path, ec);
  return res;
}

bool is_png(const std::string& path) {
  static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary);
  unsigned char head[8] = {};
  if (!in.read(reinterpret_cast<char*>(head), 8))
    return false;
  return std::memcmp(head, signature, 8) == 0;
}

} // namespace rlforge::examples::report

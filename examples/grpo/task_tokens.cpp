// The built-in tasks' shared decoding (task_tokens.hpp).
#include "examples/grpo/task_tokens.hpp"

#include <stdexcept>

namespace rlforge::examples::grpo {

std::string decode_ids(const std::vector<int64_t>& ids, int64_t vocab_size, const char* who,
                       const std::function<std::string(int64_t)>& text_of) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto id = ids[i];
    if (id < 0 || id >= vocab_size)
      throw std::invalid_argument(std::string{who} + ": id " + std::to_string(id) +
                                  " at position " + std::to_string(i) +
                                  " is outside the vocabulary [0, " +
                                  std::to_string(vocab_size) + ")");
    if (id == pad_id)
      out += "<pad>";
    else if (id == bos_id)
      out += "<bos>";
    else if (id == eos_id)
      out += "<eos>";
    else
      out += text_of(id);
  }
  return out;
}

} // namespace rlforge::examples::grpo

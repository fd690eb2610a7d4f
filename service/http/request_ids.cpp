#include "service/http/request_ids.hpp"

#include <exception>

#include <nlohmann/json.hpp>

#include "service/wire/compression.hpp"

namespace rlforge::service::http {

namespace {

/// `body` with the bare literals NaN, Infinity and -Infinity outside strings replaced by null.
std::string with_null_literals(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (in_string) {
      out.push_back(c);
      if (c == '\\' && i + 1 < body.size())
        out.push_back(body[++i]);
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out.push_back(c);
      continue;
    }
    bool replaced = false;
    for (std::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (body.substr(i, word.size()) == word) {
        out += "null";
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced)
      out.push_back(c);
  }
  return out;
}

/// Reads a protobuf varint at `p` (advancing it); false at the end or after 10 bytes.
bool read_varint(const unsigned char*& p, const unsigned char* end, uint64_t& out) {
  out = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    uint64_t b = *p++;
    out |= (b & 0x7f) << shift;
    if (!(b & 0x80))
      return true;
  }
  return false;
}

/// Fields 1 (model_id, string) and 2 (seq_id, int32) of a ForwardBackwardRequest, scanned until
/// both are found or a field does not parse.
std::pair<std::string, int64_t> proto_ids(std::string_view body) {
  std::string model_id;
  int64_t seq_id = -1;
  auto p = reinterpret_cast<const unsigned char*>(body.data());
  auto end = p + body.size();
  while (p < end && (model_id.empty() || seq_id < 0)) {
    uint64_t key = 0, value = 0;
    if (!read_varint(p, end, key))
      break;
    auto field = key >> 3;
    auto wire = key & 7;
    if (wire == 0) {
      if (!read_varint(p, end, value))
        break;
      if (field == 2)
        seq_id = static_cast<int64_t>(static_cast<int32_t>(value));
    } else if (wire == 2) {
      if (!read_varint(p, end, value) || value > static_cast<uint64_t>(end - p))
        break;
      if (field == 1)
        model_id.assign(reinterpret_cast<const char*>(p), static_cast<size_t>(value));
      p += value;
    } else if (wire == 1 || wire == 5) {
      size_t n = wire == 1 ? 8 : 4;
      if (static_cast<size_t>(end - p) < n)
        break;
      p += n;
    } else {
      break;
    }
  }
  if (model_id.empty() || seq_id < 0)
    return {"", -1};
  return {model_id, seq_id};
}

} // namespace

std::pair<std::string, int64_t> ordered_request_ids(std::string_view content_type,
                                                    std::string_view content_encoding,
                                                    std::string_view body, size_t max_bytes) {
  try {
    std::string plain = decode_content(body, content_encoding, max_bytes);
    if (content_type.rfind("application/x-protobuf", 0) == 0 ||
        content_type.rfind("application/protobuf", 0) == 0)
      return proto_ids(plain);
    auto j = nlohmann::json::parse(with_null_literals(plain), nullptr, false);
    if (j.is_object() && j.contains("model_id") && j["model_id"].is_string() &&
        j.contains("seq_id") && j["seq_id"].is_number_integer()) {
      auto seq = j["seq_id"].get<int64_t>();
      auto model = j["model_id"].get<std::string>();
      if (seq >= 0 && !model.empty())
        return {model, seq};
    }
  } catch (const std::exception&) {
  }
  return {"", -1};
}

} // namespace rlforge::service::http

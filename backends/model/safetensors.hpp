#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>

#include "backends/model/safetensors_header.hpp"

namespace rlforge::backends {

/// The tensors and the "__metadata__" map of one safetensors file.
struct safetensors_file {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Reads every tensor of the safetensors file at `path`, in its stored dtype, each in its own
/// CPU memory (nothing refers to the file afterwards). Throws `error{not_found}` for a missing
/// file, `error{io_error}` when reading fails, `error{decode_error}` for a malformed file.
std::map<std::string, at::Tensor> read_safetensors(const std::string& path);

/// The dtype a reader keeps a tensor in, from its name and the dtype the file stores it in.
using dtype_choice = std::function<at::ScalarType(const std::string& name, at::ScalarType stored)>;

/// As `read_safetensors`, tensor `name` kept as `keep_as(name, stored dtype)` (e.g. bf16 for the
/// GEMM weights of a model that only infers): a tensor kept in another dtype is converted as it
/// is read, a few MiB of the file's data at a time, so no tensor is ever held in both dtypes.
/// Throws as `read_safetensors`.
std::map<std::string, at::Tensor> read_safetensors(const std::string& path,
                                                   const dtype_choice& keep_as);

/// As `read_safetensors`, also returning the file's metadata.
safetensors_file read_safetensors_file(const std::string& path, const dtype_choice& keep_as = {});

/// Reads only the header of the safetensors file at `path` (tensor names, dtypes, shapes).
safetensors_header read_safetensors_header(const std::string& path);

/// Writes `tensors` (any device and layout; stored as contiguous CPU bytes, names sorted) and
/// `metadata` to `path` in the safetensors format. The write is atomic: a temporary file next to
/// `path` is written, fsynced and renamed over it. Throws `error{invalid_argument}` naming an
/// undefined tensor, an unsupported dtype or a reserved/empty name, `error{io_error}` naming the
/// path when writing fails.
void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Writes `contents` to `path` atomically (temporary file next to it, fsync, rename, fsync of
/// the directory). Throws `error{io_error}` naming the path when any step fails.
void write_file_atomically(const std::string& path, const std::string& contents);

/// The safetensors dtype name ("F32", "BF16", ...) of a torch scalar type; throws
/// `error{invalid_argument}` for types the format cannot hold.
std::string safetensors_dtype_of(at::ScalarType type);

/// The torch scalar type of a safetensors dtype name; throws `error{decode_error}` for an
/// unknown name.
at::ScalarType scalar_type_of_safetensors_dtype(const std::string& dtype);

} // namespace rlforge::backends

#pragma once

#include <string>

#include <caf/error.hpp>

namespace rlforge::runtime {

/// The files of a cluster's TLS directory (`rlforge head --init-tls DIR` writes them): the
/// cluster CA (`ca.pem`, and its key `ca-key.pem`, needed only to sign more certificates) and
/// the cluster certificate every head, node and driver presents (`cert.pem`, signed by the CA)
/// with its key (`key.pem`). Keys are written with mode 0600.
struct tls_files {
  std::string ca_cert;
  std::string ca_key;
  std::string cert;
  std::string key;
};

/// The paths of the four files in `dir`.
tls_files tls_files_in(const std::string& dir);

/// Creates `dir` (if needed) and writes a new CA and a cluster certificate signed by it (EC
/// P-256 keys, valid 10 years, the certificate usable by servers and clients). Refuses, naming
/// the file, when any of the four files exists already (a CA is never overwritten by accident)
/// and names the path when a file cannot be written. Thread-safe.
caf::error init_tls(const std::string& dir);

/// Checks `dir` before a process uses it: the CA, the certificate and its key must exist and
/// parse, the key must belong to the certificate, and the certificate must be signed by the CA
/// and currently valid. The error names the file and what is wrong. (CAF's openssl module would
/// otherwise throw from its network thread on a bad file.)
caf::error check_tls(const std::string& dir);

} // namespace rlforge::runtime

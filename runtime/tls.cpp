#include "runtime/tls.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <caf/expected.hpp>

#include "runtime/errc.hpp"

namespace rlforge::runtime {

namespace {

namespace fs = std::filesystem;

struct free_pkey {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct free_x509 {
  void operator()(X509* p) const { X509_free(p); }
};
struct free_store {
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
};
struct free_store_ctx {
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
};
struct close_file {
  void operator()(FILE* f) const { std::fclose(f); }
};

using pkey_ptr = std::unique_ptr<EVP_PKEY, free_pkey>;
using x509_ptr = std::unique_ptr<X509, free_x509>;
using file_ptr = std::unique_ptr<FILE, close_file>;

/// OpenSSL's pending errors as one line (and clears them).
std::string ssl_errors() {
  std::string out;
  while (auto e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out += (out.empty() ? "" : "; ") + std::string{buf};
  }
  return out.empty() ? "no details from OpenSSL" : out;
}

caf::error tls_error(const std::string& what) {
  return make_error(errc::io_error, "tls: " + what);
}

pkey_ptr new_key() {
  return pkey_ptr{EVP_EC_gen("P-256")};
}

bool add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr)
    return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

/// A certificate for `key` named `common_name`, signed by `issuer_key` (self-signed when
/// `issuer` is null).
x509_ptr make_cert(EVP_PKEY* key, const char* common_name, long serial, X509* issuer,
                   EVP_PKEY* issuer_key, bool is_ca) {
  x509_ptr cert{X509_new()};
  if (!cert)
    return nullptr;
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 10L * 365 * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  auto* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("rlforge"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  bool ok = is_ca ? add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE")
                      && add_extension(cert.get(), signer, NID_key_usage,
                                       "critical,keyCertSign,cRLSign")
                  : add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE")
                      && add_extension(cert.get(), signer, NID_key_usage,
                                       "critical,digitalSignature,keyAgreement")
                      && add_extension(cert.get(), signer, NID_ext_key_usage,
                                       "serverAuth,clientAuth");
  if (!ok || X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0)
    return nullptr;
  return cert;
}

file_ptr open_for_write(const std::string& path, mode_t mode) {
  // Created with the final mode (no window in which a key is world-readable).
  auto fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode);
  if (fd < 0)
    return nullptr;
  return file_ptr{::fdopen(fd, "w")};
}

caf::error write_key(const std::string& path, EVP_PKEY* key) {
  auto f = open_for_write(path, 0600);
  if (!f || PEM_write_PrivateKey(f.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return tls_error("cannot write key file '" + path + "'");
  return caf::none;
}

caf::error write_cert(const std::string& path, X509* cert) {
  auto f = open_for_write(path, 0644);
  if (!f || PEM_write_X509(f.get(), cert) != 1)
    return tls_error("cannot write certificate file '" + path + "'");
  return caf::none;
}

caf::expected<x509_ptr> read_cert(const std::string& path, const char* what) {
  file_ptr f{std::fopen(path.c_str(), "r")};
  if (!f)
    return tls_error(std::string{what} + " '" + path + "' cannot be opened (missing or not "
                     "readable; `rlforge head --init-tls DIR` writes one)");
  x509_ptr cert{PEM_read_X509(f.get(), nullptr, nullptr, nullptr)};
  if (!cert)
    return tls_error(std::string{what} + " '" + path + "' is not a PEM certificate ("
                     + ssl_errors() + ")");
  return cert;
}

} // namespace

tls_files tls_files_in(const std::string& dir) {
  auto at = [&](const char* name) { return (fs::path{dir} / name).string(); };
  return {at("ca.pem"), at("ca-key.pem"), at("cert.pem"), at("key.pem")};
}

caf::error init_tls(const std::string& dir) {
  if (dir.empty())
    return make_error(errc::invalid_argument, "tls: the directory name is empty");
  auto files = tls_files_in(dir);
  for (auto* p : {&files.ca_cert, &files.ca_key, &files.cert, &files.key}) {
    std::error_code ec;
    if (fs::exists(*p, ec))
      return make_error(errc::already_exists,
                        "tls: '" + *p + "' exists already; refusing to overwrite a cluster's "
                        "keys (pick a new directory or remove the old files)");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return tls_error("cannot create directory '" + dir + "': " + ec.message());
  auto ca_key = new_key();
  auto key = new_key();
  if (!ca_key || !key)
    return tls_error("cannot generate keys: " + ssl_errors());
  auto ca = make_cert(ca_key.get(), "rlforge cluster CA", 1, nullptr, ca_key.get(), true);
  if (!ca)
    return tls_error("cannot create the CA certificate: " + ssl_errors());
  auto cert = make_cert(key.get(), "rlforge cluster member", 2, ca.get(), ca_key.get(), false);
  if (!cert)
    return tls_error("cannot create the cluster certificate: " + ssl_errors());
  if (auto err = write_key(files.ca_key, ca_key.get()))
    return err;
  if (auto err = write_cert(files.ca_cert, ca.get()))
    return err;
  if (auto err = write_key(files.key, key.get()))
    return err;
  return write_cert(files.cert, cert.get());
}

caf::error check_tls(const std::string& dir) {
  auto files = tls_files_in(dir);
  auto ca = read_cert(files.ca_cert, "CA certificate");
  if (!ca)
    return std::move(ca.error());
  auto cert = read_cert(files.cert, "certificate");
  if (!cert)
    return std::move(cert.error());
  file_ptr f{std::fopen(files.key.c_str(), "r")};
  if (!f)
    return tls_error("key '" + files.key + "' cannot be opened (missing or not readable)");
  pkey_ptr key{PEM_read_PrivateKey(f.get(), nullptr, nullptr, nullptr)};
  if (!key)
    return tls_error("key '" + files.key + "' is not a PEM private key (" + ssl_errors() + ")");
  if (X509_check_private_key(cert->get(), key.get()) != 1)
    return tls_error("key '" + files.key + "' does not belong to certificate '" + files.cert
                     + "'");
  std::unique_ptr<X509_STORE, free_store> store{X509_STORE_new()};
  std::unique_ptr<X509_STORE_CTX, free_store_ctx> ctx{X509_STORE_CTX_new()};
  if (!store || !ctx || X509_STORE_add_cert(store.get(), ca->get()) != 1
      || X509_STORE_CTX_init(ctx.get(), store.get(), cert->get(), nullptr) != 1)
    return tls_error("cannot set up certificate verification: " + ssl_errors());
  if (X509_verify_cert(ctx.get()) != 1)
    return tls_error("certificate '" + files.cert + "' does not verify against CA '"
                     + files.ca_cert + "': "
                     + X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())));
  return caf::none;
}

} // namespace rlforge::runtime

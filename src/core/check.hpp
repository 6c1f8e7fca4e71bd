// Checks and errors. Two tiers (STYLE rule 7):
//  * expected outcomes return a status; broken invariants and failed library calls throw
//    `InternalError` through the KVGRID_CHECK family, with file, line and rank in the message;
//  * bad user input throws `InputError`, which the CLI turns into a clear message and exit 2.
// Every MPI and HDF5 call goes through KVGRID_MPI_CHECK / KVGRID_HDF5_CHECK (HDF5 already defines
// H5CHECK, hence the longer name).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kvgrid {

// Bad input from a user: experiment file, CLI flag, trace, storage object. Exit code 2.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bug or broken invariant inside kvgrid, or a failed library call.
class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A condition that ends a run as FAILED at once (exit 1): a shape mismatch between pipeline
// stages, an oracle mismatch under --strict. Not a bug in kvgrid: the protocol under test broke.
class RunFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The online consensus checker stopped the run. `description` ("Found rank divergence: …") is set
// on the rank that reported it (and printed there before anyone stopped); empty elsewhere.
class DivergenceFound : public RunFailure {
 public:
  DivergenceFound(const std::string& what, std::string description)
      : RunFailure(what), description(std::move(description)) {}
  std::string description;
};

// The world rank of this process, or -1 before MPI is initialised; used in check messages.
int check_rank();

[[noreturn]] void fail_check(const char* file, int line, const std::string& what);

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
std::string mpi_error_string(int code);
}  // namespace detail

}  // namespace kvgrid

#define KVGRID_CHECK(cond, ...)                                                               \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::kvgrid::fail_check(__FILE__, __LINE__,                                                \
                           ::kvgrid::detail::concat("check failed: `" #cond "` ", ##__VA_ARGS__)); \
  } while (0)

#define KVGRID_MPI_CHECK(call)                                                                \
  do {                                                                                        \
    int kvgrid_mpi_rc_ = (call);                                                              \
    if (kvgrid_mpi_rc_ != MPI_SUCCESS) [[unlikely]]                                           \
      ::kvgrid::fail_check(__FILE__, __LINE__,                                                \
                           ::kvgrid::detail::concat(#call " failed: ",                        \
                                                    ::kvgrid::detail::mpi_error_string(kvgrid_mpi_rc_))); \
  } while (0)

// HDF5 calls return a negative value (herr_t or hid_t) on failure.
#define KVGRID_HDF5_CHECK(call)                                                               \
  ([&]() {                                                                                    \
    auto kvgrid_h5_rc_ = (call);                                                              \
    if (kvgrid_h5_rc_ < 0) [[unlikely]]                                                       \
      ::kvgrid::fail_check(__FILE__, __LINE__, #call " failed");                              \
    return kvgrid_h5_rc_;                                                                     \
  }())

#ifdef KVGRID_DEBUG_CHECKS_ALWAYS
#define KVGRID_DEBUG_CHECKS_ON() true
#else
#define KVGRID_DEBUG_CHECKS_ON() ::kvgrid::debug_checks_enabled()
#endif

namespace kvgrid {
// Costly invariant checks (tree verify() after each operation, ...) run only when enabled:
// tests enable them; runs enable them with `--set engine.debug_checks=true`.
bool debug_checks_enabled();
void set_debug_checks(bool on);
}  // namespace kvgrid

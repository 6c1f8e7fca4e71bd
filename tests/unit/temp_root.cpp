// Every temporary file or directory a unit test makes lies under one directory of this process
// (TMPDIR while the tests run), removed when they end: tests need not clean up after themselves,
// and a run — the whole binary or one test of it (ctest's unit_case entries) — leaves nothing behind.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

class TempRoot : public ::testing::Environment {
 public:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvgrid-unit-tests-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) return;  // (then the tests use the temporary directory itself)
    root_ = tmpl;
    setenv("TMPDIR", root_.c_str(), 1);
  }
  void TearDown() override {
    if (root_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }

 private:
  std::string root_;
};

const bool registered = [] {
  ::testing::AddGlobalTestEnvironment(new TempRoot);
  return true;
}();

}  // namespace

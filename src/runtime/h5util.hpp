// Small RAII and helper layer over the HDF5 C API, shared by the trace writer and reader.
// Every call goes through KVGRID_HDF5_CHECK. Only the main thread of a rank calls HDF5 (the
// library is not thread-safe here).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace kvgrid::h5 {

// Owns one hid_t and closes it with the matching H5*close.
class Handle {
 public:
  enum class Kind { File, Group, Dataset, Datatype, Dataspace, Attribute, Plist };
  Handle() = default;
  Handle(hid_t id, Kind kind) : id_(id), kind_(kind) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(o.id_), kind_(o.kind_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      kind_ = o.kind_;
      o.id_ = -1;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = -1;
  Kind kind_ = Kind::File;
};

Handle string_type(std::size_t size);  // fixed length, NUL-padded, UTF-8
Handle vlen_string_type();             // variable length, UTF-8 (a `const char*` in memory)
void write_attr(hid_t obj, const std::string& name, const std::string& value);
void write_attr(hid_t obj, const std::string& name, std::int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);

using AttrValue = std::variant<std::int64_t, double, std::string>;
// All attributes of an object that are integers, floats or strings.
std::map<std::string, AttrValue> read_attrs(hid_t obj);

// A 1-D chunked dataset of records of one compound type, extended on each append.
class AppendTable {
 public:
  AppendTable() = default;
  AppendTable(hid_t loc, const std::string& name, hid_t type, std::size_t chunk_rows);
  void append(const void* rows, std::size_t n);
  std::uint64_t rows() const { return rows_; }
  hid_t dataset() const { return dset_.get(); }

 private:
  Handle dset_;
  hid_t type_ = -1;  // borrowed
  std::uint64_t rows_ = 0;
  Handle dxpl_;                            // the writes' transfer list, with our buffers
  std::vector<unsigned char> tconv_, bkg_;  // HDF5's conversion and background buffers
};

// Number of rows of a 1-D dataset.
std::uint64_t dataset_rows(hid_t dset);
// Silences HDF5's automatic error stack printing (the reader reports errors itself).
void silence_errors();

}  // namespace kvgrid::h5

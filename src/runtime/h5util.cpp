#include "runtime/h5util.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace kvgrid::h5 {

void Handle::reset() {
  if (id_ < 0) return;
  switch (kind_) {
    case Kind::File: H5Fclose(id_); break;
    case Kind::Group: H5Gclose(id_); break;
    case Kind::Dataset: H5Dclose(id_); break;
    case Kind::Datatype: H5Tclose(id_); break;
    case Kind::Dataspace: H5Sclose(id_); break;
    case Kind::Attribute: H5Aclose(id_); break;
    case Kind::Plist: H5Pclose(id_); break;
  }
  id_ = -1;
}

Handle string_type(std::size_t size) {
  Handle t(KVGRID_HDF5_CHECK(H5Tcopy(H5T_C_S1)), Handle::Kind::Datatype);
  KVGRID_HDF5_CHECK(H5Tset_size(t.get(), size == 0 ? 1 : size));
  KVGRID_HDF5_CHECK(H5Tset_strpad(t.get(), H5T_STR_NULLPAD));
  KVGRID_HDF5_CHECK(H5Tset_cset(t.get(), H5T_CSET_UTF8));
  return t;
}

Handle vlen_string_type() {
  Handle t(KVGRID_HDF5_CHECK(H5Tcopy(H5T_C_S1)), Handle::Kind::Datatype);
  KVGRID_HDF5_CHECK(H5Tset_size(t.get(), H5T_VARIABLE));
  KVGRID_HDF5_CHECK(H5Tset_cset(t.get(), H5T_CSET_UTF8));
  return t;
}

namespace {
void write_attr_raw(hid_t obj, const std::string& name, hid_t type, const void* data) {
  if (KVGRID_HDF5_CHECK(H5Aexists(obj, name.c_str())) > 0) KVGRID_HDF5_CHECK(H5Adelete(obj, name.c_str()));
  Handle space(KVGRID_HDF5_CHECK(H5Screate(H5S_SCALAR)), Handle::Kind::Dataspace);
  Handle a(KVGRID_HDF5_CHECK(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT)),
           Handle::Kind::Attribute);
  KVGRID_HDF5_CHECK(H5Awrite(a.get(), type, data));
}
}  // namespace

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  Handle t = string_type(value.size());
  std::string padded = value.empty() ? std::string(1, '\0') : value;
  write_attr_raw(obj, name, t.get(), padded.data());
}
void write_attr(hid_t obj, const std::string& name, std::int64_t value) {
  write_attr_raw(obj, name, H5T_NATIVE_INT64, &value);
}
void write_attr(hid_t obj, const std::string& name, double value) {
  write_attr_raw(obj, name, H5T_NATIVE_DOUBLE, &value);
}

std::map<std::string, AttrValue> read_attrs(hid_t obj) {
  std::map<std::string, AttrValue> out;
  H5O_info_t info;
  KVGRID_HDF5_CHECK(H5Oget_info(obj, &info));
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    Handle a(KVGRID_HDF5_CHECK(H5Aopen_by_idx(obj, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT)),
             Handle::Kind::Attribute);
    char name[256];
    KVGRID_HDF5_CHECK(H5Aget_name(a.get(), sizeof(name), name));
    Handle t(KVGRID_HDF5_CHECK(H5Aget_type(a.get())), Handle::Kind::Datatype);
    switch (H5Tget_class(t.get())) {
      case H5T_INTEGER: {
        std::int64_t v = 0;
        KVGRID_HDF5_CHECK(H5Aread(a.get(), H5T_NATIVE_INT64, &v));
        out[name] = v;
        break;
      }
      case H5T_FLOAT: {
        double v = 0;
        KVGRID_HDF5_CHECK(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v));
        out[name] = v;
        break;
      }
      case H5T_STRING: {
        if (H5Tis_variable_str(t.get()) > 0) break;
        std::string s(H5Tget_size(t.get()), '\0');
        KVGRID_HDF5_CHECK(H5Aread(a.get(), t.get(), s.data()));
        s.resize(s.find('\0') == std::string::npos ? s.size() : s.find('\0'));
        out[name] = s;
        break;
      }
      default: break;
    }
  }
  return out;
}

AppendTable::AppendTable(hid_t loc, const std::string& name, hid_t type, std::size_t chunk_rows) : type_(type) {
  hsize_t dims[1] = {0}, maxdims[1] = {H5S_UNLIMITED}, chunk[1] = {chunk_rows};
  Handle space(KVGRID_HDF5_CHECK(H5Screate_simple(1, dims, maxdims)), Handle::Kind::Dataspace);
  Handle dcpl(KVGRID_HDF5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), Handle::Kind::Plist);
  KVGRID_HDF5_CHECK(H5Pset_chunk(dcpl.get(), 1, chunk));
  dset_ = Handle(KVGRID_HDF5_CHECK(H5Dcreate2(loc, name.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
                 Handle::Kind::Dataset);
}

void AppendTable::append(const void* rows, std::size_t n) {
  if (n == 0) return;
  hsize_t newsize[1] = {rows_ + n};
  KVGRID_HDF5_CHECK(H5Dset_extent(dset_.get(), newsize));
  Handle fspace(KVGRID_HDF5_CHECK(H5Dget_space(dset_.get())), Handle::Kind::Dataspace);
  hsize_t start[1] = {rows_}, count[1] = {n};
  KVGRID_HDF5_CHECK(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr));
  Handle mspace(KVGRID_HDF5_CHECK(H5Screate_simple(1, count, nullptr)), Handle::Kind::Dataspace);
  // HDF5 converts compound rows through a type-conversion and a background buffer, by default
  // freshly allocated (1 MB, zeroed) at every write: at a flush every few steps that zeroing was a
  // fifth of a replay's time. Ours are kept, sized to the rows, and handed to it.
  // (At least 64 KiB: HDF5 refuses a buffer below what its conversion path wants for a row, which
  // can exceed the row itself.)
  const std::size_t bytes = std::max<std::size_t>(n * H5Tget_size(type_), 64 << 10);
  if (tconv_.size() < bytes) {  // (the transfer list points at the buffers: set again when they move)
    tconv_.resize(bytes);
    bkg_.resize(bytes);
    if (!dxpl_) dxpl_ = Handle(KVGRID_HDF5_CHECK(H5Pcreate(H5P_DATASET_XFER)), Handle::Kind::Plist);
    KVGRID_HDF5_CHECK(H5Pset_buffer(dxpl_.get(), tconv_.size(), tconv_.data(), bkg_.data()));
  }
  KVGRID_HDF5_CHECK(H5Dwrite(dset_.get(), type_, mspace.get(), fspace.get(), dxpl_.get(), rows));
  rows_ += n;
}

std::uint64_t dataset_rows(hid_t dset) {
  Handle space(KVGRID_HDF5_CHECK(H5Dget_space(dset)), Handle::Kind::Dataspace);
  hsize_t dims[1] = {0};
  KVGRID_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1, "dataset is not 1-D");
  KVGRID_HDF5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr));
  return dims[0];
}

void silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

}  // namespace kvgrid::h5

#include "runtime/trace_reader.hpp"

#include <filesystem>

#include "core/check.hpp"

namespace kvgrid {

using h5::Handle;

std::string RunTrace::meta_string(const std::string& k) const {
  auto it = meta.find(k);
  if (it == meta.end()) return "";
  if (auto* s = std::get_if<std::string>(&it->second)) return *s;
  return "";
}

std::int64_t RunTrace::meta_int(const std::string& k) const {
  auto it = meta.find(k);
  if (it == meta.end()) return 0;
  if (auto* v = std::get_if<std::int64_t>(&it->second)) return *v;
  return 0;
}

namespace {
// Reads a whole table. Rows with string members (variable-length: HDF5 allocates them) name
// those members in `strings`: each is interned into `pool` and HDF5's copies are freed.
template <typename Row>
std::vector<Row> read_table(hid_t file, const char* name, hid_t type, TraceStrings* pool = nullptr,
                            std::initializer_list<const char* Row::*> strings = {}) {
  std::vector<Row> rows;
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return rows;
  Handle d(H5Dopen2(file, name, H5P_DEFAULT), Handle::Kind::Dataset);
  if (!d) return rows;
  rows.resize(h5::dataset_rows(d.get()));
  if (rows.empty()) return rows;
  if (H5Dread(d.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()) < 0)
    throw InputError(std::string("table ") + name + " cannot be read (a trace of another schema version, or corrupt)");
  if (strings.size() == 0) return rows;
  std::vector<Row> raw = rows;  // HDF5's pointers, to free
  for (auto& r : rows)
    for (auto m : strings) r.*m = pool->intern(r.*m ? r.*m : "");
  Handle space(KVGRID_HDF5_CHECK(H5Dget_space(d.get())), Handle::Kind::Dataspace);
  KVGRID_HDF5_CHECK(H5Dvlen_reclaim(type, space.get(), H5P_DEFAULT, raw.data()));
  return rows;
}
}  // namespace

RunTrace read_run(const std::string& run) {
  namespace fs = std::filesystem;
  h5::silence_errors();
  fs::path p(run);
  std::error_code ec;
  if (fs::is_directory(p, ec)) p /= "run.h5";
  if (!fs::exists(p, ec)) throw InputError(run + ": no such run (expected a run directory or its run.h5)");
  RunTrace t;
  t.run_file = p.string();
  if (H5Fis_hdf5(t.run_file.c_str()) <= 0) throw InputError(t.run_file + ": not an HDF5 file");
  Handle f(H5Fopen(t.run_file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), Handle::Kind::File);
  if (!f) throw InputError(t.run_file + ": cannot open (unreadable or corrupt)");
  if (H5Lexists(f.get(), "meta", H5P_DEFAULT) <= 0) throw InputError(t.run_file + ": not a kvgrid run (no /meta)");
  {
    Handle g(KVGRID_HDF5_CHECK(H5Gopen2(f.get(), "meta", H5P_DEFAULT)), Handle::Kind::Group);
    t.meta = h5::read_attrs(g.get());
  }
  if (H5Lexists(f.get(), "summary", H5P_DEFAULT) > 0) {
    Handle g(KVGRID_HDF5_CHECK(H5Gopen2(f.get(), "summary", H5P_DEFAULT)), Handle::Kind::Group);
    t.summary = h5::read_attrs(g.get());
    Handle type = rank_summary_type();
    t.summary_ranks = read_table<RankSummaryRow>(g.get(), "ranks", type.get());
  }
  const std::int64_t world = t.meta_int("world_size");
  Handle ev = event_type(), dec = decision_type(), flt = fault_type(), rq = request_type(), st = step_type();
  for (std::int64_t r = 0; r < world; ++r) {
    RankTrace rt;
    rt.world_rank = static_cast<int>(r);
    char name[32];
    std::snprintf(name, sizeof(name), "ranks/%05d", static_cast<int>(r));
    // Opening through the external link also checks that the rank file exists and is readable.
    Handle g(H5Lexists(f.get(), "ranks", H5P_DEFAULT) > 0 ? H5Gopen2(f.get(), name, H5P_DEFAULT) : -1,
             Handle::Kind::Group);
    if (g) {
      rt.present = true;
      auto attrs = h5::read_attrs(g.get());
      auto geti = [&](const char* k) {
        auto it = attrs.find(k);
        return it != attrs.end() && std::holds_alternative<std::int64_t>(it->second)
                   ? static_cast<int>(std::get<std::int64_t>(it->second)) : 0;
      };
      rt.group = geti("group");
      rt.tp = geti("tp");
      rt.cp = geti("cp");
      rt.pp = geti("pp");
      if (auto it = attrs.find("completed_step"); it != attrs.end() && std::holds_alternative<std::int64_t>(it->second))
        rt.completed_step = static_cast<std::uint64_t>(std::get<std::int64_t>(it->second));
      auto events = read_table<EventRow>(g.get(), "events", ev.get(), t.strings.get(), {&EventRow::op});
      rt.events = events.size();
      for (const auto& e : events) ++rt.ops[e.op];
      rt.event_rows = std::move(events);
      rt.decisions = read_table<DecisionRow>(g.get(), "decisions", dec.get(), t.strings.get(), {&DecisionRow::name});
      rt.faults = read_table<FaultRow>(g.get(), "faults", flt.get(), t.strings.get(), {&FaultRow::name, &FaultRow::params});
      rt.requests = read_table<RequestRow>(g.get(), "requests", rq.get());
      rt.steps = read_table<StepRow>(g.get(), "steps", st.get());
    }
    t.ranks.push_back(std::move(rt));
  }
  return t;
}

}  // namespace kvgrid

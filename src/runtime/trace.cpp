#include "runtime/trace.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/build_info.hpp"

#include "core/check.hpp"
#include "runtime/trace_schema.hpp"

namespace kvgrid {

using h5::Handle;

namespace {
Handle compound(std::size_t size) {
  return Handle(KVGRID_HDF5_CHECK(H5Tcreate(H5T_COMPOUND, size)), Handle::Kind::Datatype);
}
void insert(hid_t t, const char* name, std::size_t off, hid_t member) {
  KVGRID_HDF5_CHECK(H5Tinsert(t, name, off, member));
}
Handle create_file(const std::string& path) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) throw InputError(path + ": cannot create trace file (exists already, or the directory is not writable)");
  return Handle(f, Handle::Kind::File);
}
}  // namespace

Handle event_type() {
  Handle t = compound(sizeof(EventRow));
  insert(t.get(), "step", offsetof(EventRow, step), H5T_NATIVE_UINT64);
  insert(t.get(), "wall_ns", offsetof(EventRow, wall_ns), H5T_NATIVE_UINT64);
  insert(t.get(), "model_ns", offsetof(EventRow, model_ns), H5T_NATIVE_UINT64);
  insert(t.get(), "request", offsetof(EventRow, request), H5T_NATIVE_UINT64);
  Handle s = h5::vlen_string_type();
  insert(t.get(), "op", offsetof(EventRow, op), s.get());
  hsize_t three[1] = {3};
  Handle arr(KVGRID_HDF5_CHECK(H5Tarray_create2(H5T_NATIVE_INT64, 1, three)), Handle::Kind::Datatype);
  insert(t.get(), "args", offsetof(EventRow, args), arr.get());
  insert(t.get(), "status", offsetof(EventRow, status), H5T_NATIVE_INT32);
  return t;
}

Handle decision_type() {
  Handle t = compound(sizeof(DecisionRow));
  insert(t.get(), "seq", offsetof(DecisionRow, seq), H5T_NATIVE_UINT64);
  insert(t.get(), "step", offsetof(DecisionRow, step), H5T_NATIVE_UINT64);
  Handle s = h5::vlen_string_type();
  insert(t.get(), "name", offsetof(DecisionRow, name), s.get());
  insert(t.get(), "args_digest", offsetof(DecisionRow, args_digest), H5T_NATIVE_UINT64);
  insert(t.get(), "result_digest", offsetof(DecisionRow, result_digest), H5T_NATIVE_UINT64);
  hsize_t three[1] = {3}, two[1] = {2};
  Handle a3(KVGRID_HDF5_CHECK(H5Tarray_create2(H5T_NATIVE_INT64, 1, three)), Handle::Kind::Datatype);
  Handle a2(KVGRID_HDF5_CHECK(H5Tarray_create2(H5T_NATIVE_INT64, 1, two)), Handle::Kind::Datatype);
  insert(t.get(), "args", offsetof(DecisionRow, args), a3.get());
  insert(t.get(), "results", offsetof(DecisionRow, results), a2.get());
  insert(t.get(), "n_args", offsetof(DecisionRow, n_args), H5T_NATIVE_INT32);
  insert(t.get(), "n_results", offsetof(DecisionRow, n_results), H5T_NATIVE_INT32);
  return t;
}

Handle fault_type() {
  Handle t = compound(sizeof(FaultRow));
  insert(t.get(), "step", offsetof(FaultRow, step), H5T_NATIVE_UINT64);
  Handle s = h5::vlen_string_type();
  insert(t.get(), "name", offsetof(FaultRow, name), s.get());
  insert(t.get(), "params", offsetof(FaultRow, params), s.get());
  return t;
}

Handle rank_summary_type() {
  Handle t = compound(sizeof(RankSummaryRow));
#define KVGRID_FIELD(name, type) insert(t.get(), #name, offsetof(RankSummaryRow, name), type)
  KVGRID_FIELD(rank, H5T_NATIVE_INT32);
  KVGRID_FIELD(group, H5T_NATIVE_INT32);
  KVGRID_FIELD(tp, H5T_NATIVE_INT32);
  KVGRID_FIELD(cp, H5T_NATIVE_INT32);
  KVGRID_FIELD(pp, H5T_NATIVE_INT32);
  KVGRID_FIELD(verify_failures, H5T_NATIVE_INT32);
  KVGRID_FIELD(tree_digest, H5T_NATIVE_UINT64);
  KVGRID_FIELD(decision_digest, H5T_NATIVE_UINT64);
  KVGRID_FIELD(decisions, H5T_NATIVE_UINT64);
  KVGRID_FIELD(faults_fired, H5T_NATIVE_UINT64);
  KVGRID_FIELD(tree_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(tree_nodes, H5T_NATIVE_INT64);
  KVGRID_FIELD(requests, H5T_NATIVE_INT64);
  KVGRID_FIELD(admitted, H5T_NATIVE_INT64);
  KVGRID_FIELD(matched_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(prompt_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(oracle_mismatches, H5T_NATIVE_INT64);
  KVGRID_FIELD(model_ns, H5T_NATIVE_INT64);
  KVGRID_FIELD(d2h_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(h2d_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_read_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_write_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_failed_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_objects_written, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_objects_read, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_objects_other_jobs, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_tokens_other_jobs, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_objects_swept, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_connection_errors, H5T_NATIVE_INT64);
  KVGRID_FIELD(d2h_bytes, H5T_NATIVE_INT64);
  KVGRID_FIELD(h2d_bytes, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_read_bytes, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_write_bytes, H5T_NATIVE_INT64);
  KVGRID_FIELD(d2h_ns, H5T_NATIVE_INT64);
  KVGRID_FIELD(h2d_ns, H5T_NATIVE_INT64);
  KVGRID_FIELD(storage_read_ns, H5T_NATIVE_INT64);
  KVGRID_FIELD(device_pool_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(device_high_water, H5T_NATIVE_INT64);
  KVGRID_FIELD(gather_bytes, H5T_NATIVE_INT64);
  KVGRID_FIELD(gather_ns, H5T_NATIVE_INT64);
  KVGRID_FIELD(kv_digest, H5T_NATIVE_UINT64);
  KVGRID_FIELD(fused_steps, H5T_NATIVE_INT64);
  KVGRID_FIELD(oracle_thread_chunks, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_sent_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_sent_bytes, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_broken, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_failed, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_restore_failed, H5T_NATIVE_INT64);
  KVGRID_FIELD(load_failed, H5T_NATIVE_INT64);
  KVGRID_FIELD(load_recomputed_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(hybrid, H5T_NATIVE_INT64);
  KVGRID_FIELD(swa_tombstones_made, H5T_NATIVE_INT64);
  KVGRID_FIELD(swa_tombstones_healed, H5T_NATIVE_INT64);
  KVGRID_FIELD(swa_freed_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(swa_windows_released, H5T_NATIVE_INT64);
  KVGRID_FIELD(mamba_states_copied, H5T_NATIVE_INT64);
  KVGRID_FIELD(mamba_states_saved, H5T_NATIVE_INT64);
  KVGRID_FIELD(swa_waits, H5T_NATIVE_INT64);
  KVGRID_FIELD(full_alone_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(swa_cost_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(mamba_cost_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_sent_full_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_sent_swa_pages, H5T_NATIVE_INT64);
  KVGRID_FIELD(sessions_opened, H5T_NATIVE_INT64);
  KVGRID_FIELD(sessions_closed, H5T_NATIVE_INT64);
  KVGRID_FIELD(session_registered, H5T_NATIVE_INT64);
  KVGRID_FIELD(session_stale_finishes, H5T_NATIVE_INT64);
  KVGRID_FIELD(forced_referenced_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(forced_referenced_host_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(recency_inversion_tokens, H5T_NATIVE_INT64);
  KVGRID_FIELD(pd_sent_states, H5T_NATIVE_INT64);
#undef KVGRID_FIELD
  return t;
}

Handle request_type() {
  Handle t = compound(sizeof(RequestRow));
#define KVGRID_FIELD(name, type) insert(t.get(), #name, offsetof(RequestRow, name), type)
  KVGRID_FIELD(request, H5T_NATIVE_UINT64);
  KVGRID_FIELD(round, H5T_NATIVE_UINT32);
  KVGRID_FIELD(prompt_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(output_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(cached_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(computed_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(host_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(storage_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(oracle_ok, H5T_NATIVE_INT32);
  KVGRID_FIELD(failed, H5T_NATIVE_INT32);
  KVGRID_FIELD(arrival_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(admit_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(first_token_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(finish_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(ttft_model_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(queue_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(forward_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(ttft_wall_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(decode_ns, H5T_NATIVE_UINT64);
  KVGRID_FIELD(spec_rounds, H5T_NATIVE_UINT32);
  KVGRID_FIELD(spec_proposed, H5T_NATIVE_UINT32);
  KVGRID_FIELD(spec_accepted, H5T_NATIVE_UINT32);
  KVGRID_FIELD(draft_mismatches, H5T_NATIVE_UINT32);
  KVGRID_FIELD(pd_transferred_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(session, H5T_NATIVE_UINT64);
#undef KVGRID_FIELD
  return t;
}

Handle step_type() {
  Handle t = compound(sizeof(StepRow));
  insert(t.get(), "step", offsetof(StepRow, step), H5T_NATIVE_UINT64);
  insert(t.get(), "model_start_ns", offsetof(StepRow, model_start_ns), H5T_NATIVE_UINT64);
  insert(t.get(), "wall_start_ns", offsetof(StepRow, wall_start_ns), H5T_NATIVE_UINT64);
  // One named column per phase and clock ("forward_model_ns", "forward_wall_ns", ...).
  for (std::size_t i = 0; i < kStepPhaseCount; ++i) {
    const std::string p = kStepPhases[i];
    insert(t.get(), (p + "_model_ns").c_str(), offsetof(StepRow, phase_model_ns) + i * sizeof(std::uint64_t), H5T_NATIVE_UINT64);
    insert(t.get(), (p + "_wall_ns").c_str(), offsetof(StepRow, phase_wall_ns) + i * sizeof(std::uint64_t), H5T_NATIVE_UINT64);
  }
#define KVGRID_FIELD(name, type) insert(t.get(), #name, offsetof(StepRow, name), type)
  KVGRID_FIELD(batch_requests, H5T_NATIVE_UINT32);
  KVGRID_FIELD(prefill_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(decode_tokens, H5T_NATIVE_UINT32);
  KVGRID_FIELD(waiting, H5T_NATIVE_UINT32);
  KVGRID_FIELD(running, H5T_NATIVE_UINT32);
  KVGRID_FIELD(device_pages_used, H5T_NATIVE_INT64);
  KVGRID_FIELD(host_pages_used, H5T_NATIVE_INT64);
#undef KVGRID_FIELD
  return t;
}

std::string rank_file_name(int world_rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.h5", world_rank);
  return buf;
}

TraceWriter::TraceWriter(const std::string& dir, const RankGrid& grid, const RunMeta& meta)
    : ev_type_(event_type()), dec_type_(decision_type()), fault_type_(fault_type()), req_type_(request_type()),
      step_type_(step_type()) {
  namespace fs = std::filesystem;
  h5::silence_errors();  // failures are reported by our own messages and checks
  if (grid.world_rank() == 0) {
    Handle run = create_file((fs::path(dir) / "run.h5").string());
    Handle g(KVGRID_HDF5_CHECK(H5Gcreate2(run.get(), "meta", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), Handle::Kind::Group);
    h5::write_attr(g.get(), "experiment", meta.experiment);
    h5::write_attr(g.get(), "source", meta.source);
    h5::write_attr(g.get(), "config", meta.config_toml);
    h5::write_attr(g.get(), "topology", meta.topology);
    h5::write_attr(g.get(), "workload", meta.workload);
    h5::write_attr(g.get(), "page_size", meta.page_size);
    h5::write_attr(g.get(), "started", meta.started);
    h5::write_attr(g.get(), "seed", meta.seed);
    h5::write_attr(g.get(), "world_size", meta.world_size);
    h5::write_attr(g.get(), "kvgrid_version", std::string(build::version()));
    h5::write_attr(g.get(), "git_revision", std::string(build::git_revision()));
    h5::write_attr(g.get(), "hdf5_version", std::string(build::hdf5_version()));
    char mpi_ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    KVGRID_MPI_CHECK(MPI_Get_library_version(mpi_ver, &len));
    std::string mv(mpi_ver, static_cast<std::size_t>(len));
    h5::write_attr(g.get(), "mpi_version", mv.substr(0, mv.find('\n')));
    // 2: units and descriptions (trace_schema); 3: variable-length UTF-8 strings, the steps table
    h5::write_attr(g.get(), "schema_version", static_cast<std::int64_t>(3));
    // The rank whose file holds the run's requests table: the last stage's leader of the group that
    // records them (P/D: decode); -1 for the tree loop, which has none.
    const auto& spec = grid.spec();
    const int rg = static_cast<int>(spec.groups.size()) - 1;
    const int requests_rank =
        meta.workload == "tree" ? -1 : layout_rank(spec, rg, spec.groups[static_cast<std::size_t>(rg)].shape.pp - 1, 0, 0);
    h5::write_attr(g.get(), "requests_rank", static_cast<std::int64_t>(requests_rank));
    h5::write_attr(g.get(), "description",
                   std::string("the run: configuration, seed, topology, versions; /ranks/NNNNN link to the rank files "
                               "(events, decisions, faults, requests, steps), /summary at a clean end"));
    Handle ranks(KVGRID_HDF5_CHECK(H5Gcreate2(run.get(), "ranks", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
                 Handle::Kind::Group);
    for (int r = 0; r < grid.world_size(); ++r) {
      char name[16];
      std::snprintf(name, sizeof(name), "%05d", r);
      KVGRID_HDF5_CHECK(H5Lcreate_external(rank_file_name(r).c_str(), "/", ranks.get(), name, H5P_DEFAULT, H5P_DEFAULT));
    }
  }
  file_ = create_file((fs::path(dir) / rank_file_name(grid.world_rank())).string());
  const auto& c = grid.coord();
  h5::write_attr(file_.get(), "world_rank", static_cast<std::int64_t>(grid.world_rank()));
  h5::write_attr(file_.get(), "group", static_cast<std::int64_t>(c.group));
  h5::write_attr(file_.get(), "tp", static_cast<std::int64_t>(c.tp));
  h5::write_attr(file_.get(), "cp", static_cast<std::int64_t>(c.cp));
  h5::write_attr(file_.get(), "pp", static_cast<std::int64_t>(c.pp));
  events_tbl_ = h5::AppendTable(file_.get(), "events", ev_type_.get(), 1024);
  decisions_tbl_ = h5::AppendTable(file_.get(), "decisions", dec_type_.get(), 1024);
  faults_tbl_ = h5::AppendTable(file_.get(), "faults", fault_type_.get(), 64);
  requests_tbl_ = h5::AppendTable(file_.get(), "requests", req_type_.get(), 256);
  steps_tbl_ = h5::AppendTable(file_.get(), "steps", step_type_.get(), 1024);
  describe_table(events_tbl_.dataset(), trace_table("events"));
  describe_table(decisions_tbl_.dataset(), trace_table("decisions"));
  describe_table(faults_tbl_.dataset(), trace_table("faults"));
  describe_table(requests_tbl_.dataset(), trace_table("requests"));
  describe_table(steps_tbl_.dataset(), trace_table("steps"));
  KVGRID_HDF5_CHECK(H5Fflush(file_.get(), H5F_SCOPE_LOCAL));
}

TraceWriter::~TraceWriter() {
  try {
    flush();
  } catch (...) {
  }
}

void TraceWriter::decisions(std::vector<DecisionRecord> d) {
  for (const auto& r : d) {
    DecisionRow row;
    row.seq = r.seq;
    row.step = r.step;
    row.name = strings_.intern(r.name);
    row.args_digest = r.args_digest;
    row.result_digest = r.result_digest;
    for (int i = 0; i < 3; ++i) row.args[i] = r.args[i];
    for (int i = 0; i < 2; ++i) row.results[i] = r.results[i];
    row.n_args = r.n_args;
    row.n_results = r.n_results;
    decisions_.push_back(row);
  }
}

void TraceWriter::faults(std::vector<FailpointFiring> f) {
  for (const auto& r : f) {
    FaultRow row;
    row.step = r.step;
    row.name = strings_.intern(r.name);
    row.params = strings_.intern(r.params);
    faults_.push_back(row);
  }
}

void TraceWriter::event(std::uint64_t step, std::uint64_t wall_ns, std::uint64_t model_ns, std::uint64_t request,
                        const char* op, std::int64_t a0, std::int64_t a1, std::int64_t a2, std::int32_t status) {
  EventRow e;
  e.step = step;
  e.wall_ns = wall_ns;
  e.model_ns = model_ns;
  e.request = request;
  e.op = strings_.intern(op);
  e.args[0] = a0;
  e.args[1] = a1;
  e.args[2] = a2;
  e.status = status;
  events_.push_back(e);
}

void TraceWriter::flush_all(DecisionLog& log, FailpointRegistry& faults) {
  decisions(log.take_new());
  this->faults(faults.take_new());
  flush();
}

void TraceWriter::flush() {
  if (!file_) return;
  events_tbl_.append(events_.data(), events_.size());
  decisions_tbl_.append(decisions_.data(), decisions_.size());
  faults_tbl_.append(faults_.data(), faults_.size());
  requests_tbl_.append(requests_.data(), requests_.size());
  steps_tbl_.append(steps_.data(), steps_.size());
  requests_.clear();
  steps_.clear();
  events_.clear();
  decisions_.clear();
  faults_.clear();
  if (completed_step_ >= 0) h5::write_attr(file_.get(), "completed_step", completed_step_);
  KVGRID_HDF5_CHECK(H5Fflush(file_.get(), H5F_SCOPE_LOCAL));
}

void TraceWriter::write_summary(const std::string& dir, const RunSummary& s) {
  const std::string path = (std::filesystem::path(dir) / "run.h5").string();
  Handle run(KVGRID_HDF5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)), Handle::Kind::File);
  Handle g(KVGRID_HDF5_CHECK(H5Gcreate2(run.get(), "summary", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), Handle::Kind::Group);
  h5::write_attr(g.get(), "verdict", s.verdict);
  h5::write_attr(g.get(), "steps", s.steps);
  h5::write_attr(g.get(), "verify_failures", s.verify_failures);
  h5::write_attr(g.get(), "tree_divergences", s.tree_divergences);
  h5::write_attr(g.get(), "decision_divergences", s.decision_divergences);
  h5::write_attr(g.get(), "checks", s.checks);
  h5::write_attr(g.get(), "wall_s", s.wall_s);
  h5::write_attr(g.get(), "oracle_mismatches", s.oracle_mismatches);
  h5::write_attr(g.get(), "requests", s.requests);
  h5::write_attr(g.get(), "finished", s.finished);
  h5::write_attr(g.get(), "failed", s.failed);
  Handle t = rank_summary_type();
  hsize_t n[1] = {s.ranks.size()};
  Handle space(KVGRID_HDF5_CHECK(H5Screate_simple(1, n, nullptr)), Handle::Kind::Dataspace);
  Handle d(KVGRID_HDF5_CHECK(H5Dcreate2(g.get(), "ranks", t.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
           Handle::Kind::Dataset);
  KVGRID_HDF5_CHECK(H5Dwrite(d.get(), t.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, s.ranks.data()));
  describe_table(d.get(), trace_table("summary/ranks"));
}

}  // namespace kvgrid

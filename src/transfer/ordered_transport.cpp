#include "transfer/ordered_transport.hpp"

#include <deque>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "core/wait.hpp"

namespace kvgrid::transfer {

namespace {

constexpr int kAnnounceTag = 1;
constexpr int kDataTag = 2;

struct Announce {
  std::int64_t tag;
  std::uint64_t bytes;
};

// An MPI request as an event (the announcement of a send).
class RequestEvent final : public EventState {
 public:
  explicit RequestEvent(std::string what) : what_(std::move(what)) {}
  bool query() override {
    if (req == MPI_REQUEST_NULL) return true;
    int flag = 0;
    KVGRID_MPI_CHECK(MPI_Test(&req, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }
  void synchronize() override {
    if (req != MPI_REQUEST_NULL) wait_mpi(&req, what_);
  }
  MPI_Request req = MPI_REQUEST_NULL;
  Announce msg{};

 private:
  std::string what_;
};

class Core;

// A posted receive: matched to an announced message (data posted into its blocks, or waiting in a
// holding buffer), or still waiting for its announcement.
class OrderedRecv final : public EventState {
 public:
  OrderedRecv(std::shared_ptr<Core> core, int peer, int tag, std::span<const Block> blocks)
      : core_(std::move(core)), peer(peer), tag(tag), blocks(blocks.begin(), blocks.end()) {
    bytes = total_bytes(blocks);
  }
  bool query() override;
  void synchronize() override;
  void cancel() override;
  // Matched: `data` moves the bytes (into the blocks, or into `holding`, scattered on completion).
  void match(Event d, std::shared_ptr<std::vector<char>> held) {
    data = std::move(d);
    holding = std::move(held);
    matched = true;
  }
  bool finish_if_done() {
    if (done) return true;
    if (!matched || !data.query()) return false;
    scatter();
    return true;
  }
  void scatter() {
    if (holding) {
      scatter_into(holding->data(), blocks);
      holding.reset();
    }
    done = true;
  }

  std::shared_ptr<Core> core_;
  int peer, tag;
  std::vector<Block> blocks;
  Event data;
  std::shared_ptr<std::vector<char>> holding;
  bool matched = false, done = false, cancelled = false;
};

// A message announced before any receive of its tag was posted: its data goes to `buffer`.
struct Held {
  int tag;
  std::shared_ptr<std::vector<char>> buffer;
  Event data;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(MPI_Comm comm, std::unique_ptr<DataPlane> plane) : plane_(std::move(plane)) {
    KVGRID_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    // Every wait of this thread takes announcements as they arrive (core/wait.hpp): the peer's
    // data may not leave until this rank posts its receive.
    hook_ = add_wait_progress([this] { progress(); });
  }
  ~Core() {
    remove_wait_progress(hook_);
    // Messages announced but never received (a cancelled receive's, a run stopped early): their data
    // receives are posted into holding buffers that go now. The data was sent after its announcement:
    // let it land (a cancel could withdraw the receive and leave the sender's request pending).
    for (auto& [peer, q] : held_)
      for (auto& h : q) try {
          h.data.synchronize();
        } catch (const std::exception&) {  // (a destructor: the run is ending anyway)
        }
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  std::string_view plane_name() const { return plane_->name(); }

  Event send(int peer, int tag, std::span<const Block> blocks) {
    auto ann = std::make_shared<RequestEvent>("announcement of a KV message to rank " + std::to_string(peer));
    ann->msg = {tag, total_bytes(blocks)};
    KVGRID_MPI_CHECK(MPI_Isend(&ann->msg, sizeof(Announce), MPI_BYTE, peer, kAnnounceTag, comm_, &ann->req));
    Event data = plane_->send(peer, blocks);
    return join({Event(ann), data});
  }

  Event recv(int peer, int tag, std::span<const Block> blocks) {
    auto r = std::make_shared<OrderedRecv>(shared_from_this(), peer, tag, blocks);
    // A message of this tag already held: this receive takes it (the oldest first).
    auto& held = held_[peer];
    for (auto it = held.begin(); it != held.end(); ++it)
      if (same_tag(it->tag, tag)) {
        KVGRID_CHECK(it->buffer->size() == r->bytes, "P/D (ordered transport): a receive of ", r->bytes,
                     " bytes from rank ", peer, " (tag ", tag, ") for a message of ", it->buffer->size());
        r->match(it->data, it->buffer);
        held.erase(it);
        return Event(r);
      }
    posted_[peer].push_back(r);
    progress();
    return Event(r);
  }

  // Takes every announcement that has arrived and posts its data receive, in arrival order.
  void progress() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      KVGRID_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kAnnounceTag, comm_, &flag, &st));
      if (!flag) return;
      Announce a{};
      KVGRID_MPI_CHECK(MPI_Recv(&a, sizeof a, MPI_BYTE, st.MPI_SOURCE, kAnnounceTag, comm_, MPI_STATUS_IGNORE));
      take(st.MPI_SOURCE, static_cast<int>(a.tag), a.bytes);
    }
  }

  void forget(OrderedRecv* r) {
    auto& q = posted_[r->peer];
    for (auto it = q.begin(); it != q.end(); ++it)
      if (it->lock().get() == r) {
        q.erase(it);
        return;
      }
  }

 private:
  // A message pairs with a receive of its own tag (the oldest first); NCCL alone pairs by order.
  static bool same_tag(int posted, int message) { return posted == message; }

  void take(int peer, int tag, std::uint64_t bytes) {
    auto& q = posted_[peer];
    for (auto it = q.begin(); it != q.end();) {
      auto p = it->lock();
      if (!p) {
        it = q.erase(it);
        continue;
      }
      OrderedRecv& r = *p;
      if (!same_tag(r.tag, tag)) {
        ++it;
        continue;
      }
      KVGRID_CHECK(r.bytes == bytes, "P/D (ordered transport): a receive of ", r.bytes, " bytes from rank ", peer, " (tag ",
                   tag, ") for a message of ", bytes);
      r.match(plane_->recv(peer, r.blocks), nullptr);
      q.erase(it);
      return;
    }
    auto buffer = std::make_shared<std::vector<char>>(bytes);
    const Block b{buffer->data(), buffer->size()};
    held_[peer].push_back({tag, buffer, plane_->recv(peer, std::span<const Block>(&b, 1))});
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int hook_ = 0;
  std::unique_ptr<DataPlane> plane_;
  // Posted receives not matched yet, oldest first (weak: a receive its poster dropped matches nothing).
  std::map<int, std::deque<std::weak_ptr<OrderedRecv>>> posted_;
  std::map<int, std::deque<Held>> held_;
};

bool OrderedRecv::query() {
  if (done) return true;
  if (!matched) core_->progress();
  return finish_if_done();
}

void OrderedRecv::synchronize() {
  if (done) return;
  if (!matched)
    wait_until(
        [this] {
          core_->progress();
          return matched;
        },
        "the announcement of a KV message from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")");
  data.synchronize();
  scatter();
}

void OrderedRecv::cancel() {
  if (done) return;
  if (!matched) core_->progress();  // an announcement already here matches first, as an MPI message that arrived
  if (!matched) {  // nothing posted on the plane: withdraw it (a later message of its tag is held instead)
    core_->forget(this);
    cancelled = done = true;
    return;
  }
  data.synchronize();  // the data is on its way: let it land (a plane cannot take it back)
  scatter();
}

class OrderedTransport final : public KvTransport {
 public:
  OrderedTransport(MPI_Comm comm, std::unique_ptr<DataPlane> plane)
      : core_(std::make_shared<Core>(comm, std::move(plane))), name_("ordered/" + std::string(core_->plane_name())) {}
  std::string_view name() const override { return name_; }
  Event send(int peer, int tag, std::span<const Block> blocks) override { return core_->send(peer, tag, blocks); }
  Event recv(int peer, int tag, std::span<const Block> blocks) override { return core_->recv(peer, tag, blocks); }

 private:
  std::shared_ptr<Core> core_;
  std::string name_;
};

// MPI on one tag: pairs operations by posting order alone, as NCCL does.
class MpiOrderedPlane final : public DataPlane {
 public:
  explicit MpiOrderedPlane(MPI_Comm comm) {
    KVGRID_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    inner_ = make_mpi_transport(comm_, MpiMode::Staged);
  }
  ~MpiOrderedPlane() override {
    inner_.reset();
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  std::string_view name() const override { return "mpi"; }
  Event send(int peer, std::span<const Block> blocks) override { return inner_->send(peer, kDataTag, blocks); }
  Event recv(int peer, std::span<const Block> blocks) override { return inner_->recv(peer, kDataTag, blocks); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<KvTransport> inner_;
};

}  // namespace

std::unique_ptr<DataPlane> make_mpi_ordered_plane(MPI_Comm comm) { return std::make_unique<MpiOrderedPlane>(comm); }

std::unique_ptr<KvTransport> make_ordered_transport(MPI_Comm comm, std::unique_ptr<DataPlane> plane) {
  return std::make_unique<OrderedTransport>(comm, std::move(plane));
}

}  // namespace kvgrid::transfer

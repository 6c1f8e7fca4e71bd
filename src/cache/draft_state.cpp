#include "cache/draft_state.hpp"

#include <cstring>

#include "core/check.hpp"

namespace kvgrid::cache {

std::string draft_layout_problem(DraftLayout layout, const DraftRowShape& d, const DraftRowShape& t) {
  if (layout != DraftLayout::Packed || (d.kv_heads == t.kv_heads && d.head_dim == t.head_dim && d.dtype == t.dtype)) return "";
  return "model.draft.mode = \"packed\" needs the draft's KV rows shaped like the target's: model.draft.kv_heads = " +
         std::to_string(d.kv_heads) + " vs model.kv_heads = " + std::to_string(t.kv_heads) + ", model.draft.head_dim = " +
         std::to_string(d.head_dim) + " vs model.head_dim = " + std::to_string(t.head_dim) + ", model.draft.dtype = \"" +
         d.dtype + "\" vs " + t.dtype + " (use mode = \"sidecar\" for a draft with its own layout)";
}

std::size_t draft_host_layers(DraftLayout layout, std::size_t target_layers, std::size_t draft_layers) {
  return layout == DraftLayout::Packed ? target_layers + draft_layers : target_layers;
}

DraftState::DraftState(DraftLayout layout, KvPool& device, KvPool* target_host, std::size_t target_layers,
                       std::int64_t own_slots)
    : layout_(layout), packed_(layout == DraftLayout::Packed), device_(device), target_host_(target_host), target_layers_(target_layers) {
  if (!target_host_) {
    if (own_slots > 0 && layout_ != DraftLayout::TargetOnly) {
      packed_ = false;  // nothing of the target's to pack into
      KvPoolConfig c = device_.config();
      c.capacity = Pages(own_slots);
      sidecar_ = std::make_unique<KvPool>(c);
    }
    return;
  }
  if (packed_) {
    if (!target_host_->block_compatible(device_))
      throw InputError("model.draft.mode = \"packed\": the draft's KV blocks (" + std::to_string(device_.heads()) +
                       " heads of " + std::to_string(device_.config().dims) + " elements per rank) differ from the target's (" +
                       std::to_string(target_host_->heads()) + " heads of " + std::to_string(target_host_->config().dims) +
                       "): they cannot share host slots (use sidecar)");
    KVGRID_CHECK(target_host_->layers() == target_layers_ + device_.layers(), "packed host pool of ", target_host_->layers(),
                 " layers for ", target_layers_, " target and ", device_.layers(), " draft layers");
  } else if (layout_ == DraftLayout::Sidecar) {
    KvPoolConfig c = device_.config();
    c.capacity = target_host_->config().capacity;  // the source pool's slot count
    sidecar_ = std::make_unique<KvPool>(c);
  }
}

const KvPool* DraftState::host() const {
  if (sidecar_) return sidecar_.get();
  return packed_ ? target_host_ : nullptr;
}

std::vector<transfer::Copy> DraftState::backup_copies(std::span<const PageId> host_pages, std::span<const PageId> device_pages) {
  if (sidecar_) return flat(layer_copies(*sidecar_, host_pages, device_, device_pages));
  if (packed_ && target_host_)
    return flat(layer_copies_at(*target_host_, host_pages, target_layers_, device_, device_pages, 0, device_.layers()));
  return {};
}

std::vector<transfer::Copy> DraftState::restore_copies(std::span<const PageId> device_pages, std::span<const PageId> host_pages) {
  if (sidecar_) return flat(layer_copies(device_, device_pages, *sidecar_, host_pages));
  if (packed_ && target_host_)
    return flat(layer_copies_at(device_, device_pages, 0, *target_host_, host_pages, target_layers_, device_.layers()));
  device_.clear(device_pages);  // target_only: the draft gets nothing back
  return {};
}

DraftStates::DraftStates(DraftLayout layout, StatePool& device, StatePool* target_host, std::size_t target_words,
                         std::int64_t own_slots)
    : layout_(layout), device_(device), target_host_(target_host), target_words_(target_words) {
  if (!target_host_) {
    if (own_slots > 0 && layout_ != DraftLayout::TargetOnly)
      sidecar_ = std::make_unique<StatePool>(static_cast<std::size_t>(own_slots), device_.words_per_slot());
    return;
  }
  if (layout_ == DraftLayout::Packed)
    KVGRID_CHECK(target_host_->words_per_slot() == target_words_ + device_.words_per_slot(), "packed host state slots of ",
                 target_host_->words_per_slot(), " words for ", target_words_, " target and ", device_.words_per_slot(), " draft words");
  if (layout_ == DraftLayout::Sidecar) sidecar_ = std::make_unique<StatePool>(target_host_->capacity(), device_.words_per_slot());
}

std::optional<transfer::Copy> DraftStates::backup_copy(std::uint32_t host_slot, std::uint32_t device_slot) {
  auto src = device_.slot(device_slot);
  const std::size_t bytes = src.size() * sizeof(std::uint64_t);
  if (sidecar_) return transfer::Copy{sidecar_->slot(host_slot).data(), src.data(), bytes};
  if (layout_ == DraftLayout::Packed && target_host_)
    return transfer::Copy{target_host_->slot(host_slot).data() + target_words_, src.data(), bytes};
  return std::nullopt;
}

std::optional<transfer::Copy> DraftStates::restore_copy(std::uint32_t device_slot, std::uint32_t host_slot) {
  auto dst = device_.slot(device_slot);
  const std::size_t bytes = dst.size() * sizeof(std::uint64_t);
  if (sidecar_) return transfer::Copy{dst.data(), sidecar_->slot(host_slot).data(), bytes};
  if (layout_ == DraftLayout::Packed && target_host_)
    return transfer::Copy{dst.data(), target_host_->slot(host_slot).data() + target_words_, bytes};
  const std::uint32_t s[1] = {device_slot};
  device_.poison(s);  // target_only: the draft gets nothing back
  return std::nullopt;
}

std::size_t DraftState::object_bytes() const {
  return sidecar_ ? sidecar_->layer_block_bytes() * sidecar_->layers() : 0;
}

std::vector<std::uint8_t> DraftState::object(PageId host_page) const {
  KVGRID_CHECK(sidecar_ != nullptr, "draft objects without a sidecar pool");
  const std::size_t block = sidecar_->layer_block_bytes();
  std::vector<std::uint8_t> out(object_bytes());
  for (std::size_t l = 0; l < sidecar_->layers(); ++l) std::memcpy(out.data() + l * block, sidecar_->layer_block(host_page, l), block);
  return out;
}

void DraftState::load_object(PageId host_page, std::span<const std::uint8_t> bytes) {
  KVGRID_CHECK(sidecar_ != nullptr && bytes.size() == object_bytes(), "draft object of ", bytes.size(), " bytes");
  const std::size_t block = sidecar_->layer_block_bytes();
  for (std::size_t l = 0; l < sidecar_->layers(); ++l) std::memcpy(sidecar_->layer_block(host_page, l), bytes.data() + l * block, block);
}

}  // namespace kvgrid::cache

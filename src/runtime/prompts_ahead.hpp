// engine.helper_thread, a trace's prompts: made on a thread of their own ahead of their arrival, so
// that making a long prompt's tokens — hashing its blocks, writing fresh memory — is off the serving
// thread. What the serving thread takes is what it would have made: make(i) is a function of i
// only, called once per i, in order.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/ids.hpp"

namespace kvgrid {

// A prompt as a workload makes it: its tokens and, where it made them, the prefix hash of its first
// (k + 1) · stride tokens at marks[k] (RequestSpec::prefix_marks).
struct MadePrompt {
  std::vector<TokenId> tokens;
  std::vector<std::uint64_t> marks;
};

class PromptsAhead {
 public:
  using Make = std::function<MadePrompt(std::size_t)>;
  // Makes prompts first, first + 1, … < end, at most `depth` of them made and not yet taken.
  PromptsAhead(std::size_t first, std::size_t end, std::size_t depth, Make make);
  ~PromptsAhead();  // stops the thread after the prompt it is making
  PromptsAhead(const PromptsAhead&) = delete;
  PromptsAhead& operator=(const PromptsAhead&) = delete;

  // Prompt i, the next in order (waits until it is made); a failure of make(i) is rethrown here.
  MadePrompt take(std::size_t i);

 private:
  void work();

  Make make_;
  const std::size_t end_, depth_;
  std::mutex mu_;
  std::condition_variable room_, ready_;
  std::deque<MadePrompt> made_;  // prompts taken_, taken_ + 1, …
  std::size_t taken_, next_;     // the next to take, the next to make
  std::exception_ptr error_;     // make(next_) failed
  bool stop_ = false;
  std::thread worker_;  // (last: started once the rest is built)
};

}  // namespace kvgrid

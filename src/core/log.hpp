// Console output. Rank 0 prints (STYLE rule 20); other ranks print only through `log_all`, which
// tags the line with the rank and goes to stderr. Lines are flushed at once so that the output of
// an aborted run is complete up to the abort.
#pragma once

#include <string>

namespace kvgrid {

void log_set_rank(int world_rank);
int log_rank();
// Printed on stdout by world rank 0 only.
void log0(const std::string& line);
// Printed on stderr by any rank, prefixed "[rank N]".
void log_all(const std::string& line);

}  // namespace kvgrid

// What every trace table and column means, with its unit — written into the trace itself as HDF5
// attributes, so that h5py, pandas or any HDF5 tool can read a trace without kvgrid's source:
//   a table:   attribute "description"
//   a column:  attributes "<column>.unit" and "<column>.description"
//   events:    "op.<op>" for every op: what its args [a0, a1, a2] and status hold
//   decisions: "name.<decision>" for every decision: its args -> results
// A test reads every table of a run and checks that each column and each op seen is described.
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

namespace kvgrid {

struct ColumnDoc {
  const char* name;
  const char* unit;
  const char* description;
};

struct TableDoc {
  const char* name;  // "events", "decisions", "faults", "requests", "summary/ranks"
  const char* description;
  std::vector<ColumnDoc> columns;
  std::vector<std::pair<const char*, const char*>> entries;  // events: op -> meaning; decisions: name -> meaning
  const char* entry_prefix = "";                              // "op." or "name."
};

const TableDoc& trace_table(const std::string& name);
// Writes the table's description, its columns' units and descriptions, and its op/decision table.
void describe_table(hid_t dataset, const TableDoc& doc);

}  // namespace kvgrid

// Schema-validated TOML configuration.
//
// A `Schema` lists every accepted key with its type, default and allowed range or values. One
// validation pass (`Config::load`) checks the file and every `--set key=value` override against
// it: a malformed file (with line and column), an unknown key, a wrong type or an out-of-range
// value throws `InputError` naming the file, the key path, what was expected and what was found.
// After loading, every schema key has a value (given or default), so readers never see a missing
// key. `effective_toml()` is the full configuration as TOML, printed as the run's `#` header and
// stored in the trace.
//
// Key paths are written as in TOML: components joined by '.', a component that itself contains a
// '.' quoted (`faults."rank.stall".probability`).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvgrid {

enum class ValueType { Integer, Float, Bool, String, IntArray, StringArray };

struct KeySpec {
  std::vector<std::string> path;  // components, e.g. {"faults", "rank.stall", "probability"}
  ValueType type = ValueType::Integer;
  std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>, std::vector<std::string>> default_value;
  std::optional<double> min;                // inclusive, numbers (and array elements)
  std::optional<double> max;                // inclusive
  std::vector<std::string> choices;         // strings: allowed values (first = default); string arrays: allowed elements
  std::string doc;                          // one line, with the unit
  bool optional_table = false;              // key only present when its table is given (no default)
  // A key of each table of an array of tables (`[[model.sidecar]]`: path {"model", "sidecar",
  // "name"}); read per element with Config::element, defaulted per element.
  bool array_element = false;
};

class Schema {
 public:
  Schema& add(KeySpec spec);
  // Tables that may appear (possibly empty) although they have no keys yet.
  Schema& add_table(std::vector<std::string> path);
  const KeySpec* find(const std::vector<std::string>& path) const;
  const std::vector<KeySpec>& keys() const { return keys_; }
  bool is_table(const std::vector<std::string>& path) const;
  // Finds the key whose display form (quoted or not) equals `dotted`.
  const KeySpec* find_dotted(std::string_view dotted) const;
  // An array of tables (`[[model.sidecar]]`); its keys are added with `array_element` set.
  Schema& add_table_array(std::vector<std::string> path);
  bool is_table_array(const std::vector<std::string>& path) const;
  const std::vector<std::vector<std::string>>& table_arrays() const { return arrays_; }

 private:
  std::vector<KeySpec> keys_;
  std::vector<std::vector<std::string>> tables_, arrays_;
};

std::string key_path_string(const std::vector<std::string>& path);
const char* value_type_name(ValueType t);

class Config {
 public:
  using Value = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>, std::vector<std::string>>;

  // Parses `path`, applies `overrides` ("key.path=value", TOML value syntax; a bare word is a
  // string), validates everything against `schema`. Throws InputError.
  static Config load(const Schema& schema, const std::string& path,
                     const std::vector<std::string>& overrides);
  static Config parse(const Schema& schema, std::string_view toml_text, const std::string& source_name,
                      const std::vector<std::string>& overrides);

  std::int64_t get_int(std::string_view dotted) const;
  double get_float(std::string_view dotted) const;
  bool get_bool(std::string_view dotted) const;
  const std::string& get_string(std::string_view dotted) const;
  const std::vector<std::int64_t>& get_int_array(std::string_view dotted) const;
  const std::vector<std::string>& get_string_array(std::string_view dotted) const;
  // True when the key was given in the file or by an override (not defaulted).
  bool given(std::string_view dotted) const;
  // True when some key under this table prefix was given.
  bool table_given(std::string_view dotted_prefix) const;
  // Arrays of tables: how many tables the file gave, and key `key` of table i (given or default).
  std::size_t elements(std::string_view dotted_array) const;
  const Value& element(std::string_view dotted_array, std::size_t i, const std::string& key) const;

  const std::string& source() const { return source_; }
  std::string effective_toml() const;

 private:
  const Value& get(std::string_view dotted) const;
  std::string source_;
  std::map<std::string, Value> values_;  // by display path
  std::map<std::string, bool> given_;
  std::vector<std::string> order_;       // schema order, for printing
  std::map<std::string, std::vector<std::string>> paths_;
  std::map<std::string, std::vector<std::map<std::string, Value>>> arrays_;  // by array path, in file order
};

}  // namespace kvgrid

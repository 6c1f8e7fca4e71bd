#include "core/config.hpp"

#include <algorithm>

#include <toml++/toml.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/check.hpp"

namespace kvgrid {

namespace {

// "; did you mean `cache.device_pages`?" — the schema key nearest to `key` by edit distance
// (within a third of its length), and where the full list is.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest_key_hint(const Schema& schema, const std::string& key) {
  std::string best;
  std::size_t best_d = key.size() / 3 + 1;
  for (const auto& k : schema.keys()) {
    const std::string name = key_path_string(k.path);
    const std::size_t d = edit_distance(key, name);
    if (d < best_d) {
      best_d = d;
      best = name;
    }
  }
  return (best.empty() ? std::string() : "; did you mean '" + best + "'?") + " (every key: kvgrid run --keys)";
}

bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return true;
  return false;
}

std::string format_value(const Config::Value& v) {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::int64_t>) {
          os << x;
        } else if constexpr (std::is_same_v<T, double>) {
          char buf[64];
          auto res = std::to_chars(buf, buf + sizeof(buf), x);  // shortest round-trip form
          std::string s(buf, res.ptr);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
          os << s;
        } else if constexpr (std::is_same_v<T, bool>) {
          os << (x ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          os << '"';
          for (char c : x) {
            if (c == '"' || c == '\\') os << '\\';
            os << c;
          }
          os << '"';
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          os << '[';
          for (std::size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << format_value(Config::Value(x[i]));
          os << ']';
        } else {
          os << '[';
          for (std::size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << x[i];
          os << ']';
        }
      },
      v);
  return os.str();
}

std::string describe_node(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "string \"" + std::string(*n.value<std::string_view>()) + "\"";
    case toml::node_type::integer: return "integer " + std::to_string(*n.value<std::int64_t>());
    case toml::node_type::floating_point: {
      std::ostringstream os;
      os << "float " << *n.value<double>();
      return os.str();
    }
    case toml::node_type::boolean: return std::string("boolean ") + (*n.value<bool>() ? "true" : "false");
    default: return "a date/time";
  }
}

std::string where(const std::string& source, const toml::node& n) {
  const auto& b = n.source().begin;
  if (b.line == 0) return source;
  return source + ":" + std::to_string(b.line) + ":" + std::to_string(b.column);
}

std::string expected_text(const KeySpec& k) {
  std::ostringstream os;
  os << value_type_name(k.type);
  if (!k.choices.empty()) {
    os << " (one of";
    for (const auto& c : k.choices) os << " \"" << c << "\"";
    os << ")";
  }
  if (k.min || k.max) {
    const bool integer = k.type == ValueType::Integer || k.type == ValueType::IntArray;
    auto num = [integer](double v) {
      std::ostringstream n;
      if (integer) n << static_cast<long long>(v);
      else n << v;
      return n.str();
    };
    os << " in [" << (k.min ? num(*k.min) : std::string("-inf")) << ", " << (k.max ? num(*k.max) : std::string("inf")) << "]";
  }
  return os.str();
}

// Converts a TOML node to the key's type, or throws InputError naming `loc` and the key.
Config::Value convert(const KeySpec& k, const toml::node& n, const std::string& loc) {
  auto bad = [&](const std::string& found) -> InputError {
    return InputError(loc + ": key '" + key_path_string(k.path) + "': expected " + expected_text(k) +
                      ", found " + found);
  };
  Config::Value v;
  switch (k.type) {
    case ValueType::Integer:
      if (!n.is_integer()) throw bad(describe_node(n));
      v = *n.value<std::int64_t>();
      break;
    case ValueType::Float:
      if (n.is_integer()) v = static_cast<double>(*n.value<std::int64_t>());
      else if (n.is_floating_point()) v = *n.value<double>();
      else throw bad(describe_node(n));
      if (!std::isfinite(std::get<double>(v))) throw bad(describe_node(n));
      break;
    case ValueType::Bool:
      if (!n.is_boolean()) throw bad(describe_node(n));
      v = *n.value<bool>();
      break;
    case ValueType::String:
      if (!n.is_string()) throw bad(describe_node(n));
      v = std::string(*n.value<std::string_view>());
      break;
    case ValueType::IntArray: {
      if (!n.is_array()) throw bad(describe_node(n));
      std::vector<std::int64_t> out;
      for (const auto& e : *n.as_array()) {
        if (!e.is_integer()) throw bad("an array containing " + describe_node(e));
        out.push_back(*e.value<std::int64_t>());
      }
      v = std::move(out);
      break;
    }
    case ValueType::StringArray: {
      // A string stands for its comma-separated names ("a, b" = ["a", "b"]; `--set key=a,b`).
      std::vector<std::string> out;
      if (n.is_string()) {
        const std::string_view text = *n.value<std::string_view>();
        std::size_t at = 0;
        while (at <= text.size()) {
          const std::size_t comma = std::min(text.find(',', at), text.size());
          std::string_view part = text.substr(at, comma - at);
          while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
          while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
          if (!part.empty()) out.emplace_back(part);
          at = comma + 1;
        }
      } else {
        if (!n.is_array()) throw bad(describe_node(n));
        for (const auto& e : *n.as_array()) {
          if (!e.is_string()) throw bad("an array containing " + describe_node(e));
          out.emplace_back(*e.value<std::string_view>());
        }
      }
      v = std::move(out);
      break;
    }
  }
  auto check_range = [&](double x, const std::string& shown) {
    if ((k.min && x < *k.min) || (k.max && x > *k.max)) throw bad(shown + " (out of range)");
  };
  if (auto* i = std::get_if<std::int64_t>(&v)) check_range(static_cast<double>(*i), std::to_string(*i));
  if (auto* d = std::get_if<double>(&v)) check_range(*d, format_value(v));
  if (auto* a = std::get_if<std::vector<std::int64_t>>(&v))
    for (auto x : *a) check_range(static_cast<double>(x), "element " + std::to_string(x));
  if (auto* s = std::get_if<std::string>(&v); s && !k.choices.empty()) {
    bool ok = false;
    for (const auto& c : k.choices) ok = ok || c == *s;
    if (!ok) throw bad("\"" + *s + "\"");
  }
  if (auto* a = std::get_if<std::vector<std::string>>(&v); a && !k.choices.empty())
    for (const auto& s : *a)
      if (std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end()) throw bad("an array containing \"" + s + "\"");
  return v;
}

bool is_prefix(const std::vector<std::string>& pre, const std::vector<std::string>& full) {
  if (pre.size() > full.size()) return false;
  for (std::size_t i = 0; i < pre.size(); ++i)
    if (pre[i] != full[i]) return false;
  return true;
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::Integer: return "integer";
    case ValueType::Float: return "number";
    case ValueType::Bool: return "boolean";
    case ValueType::String: return "string";
    case ValueType::IntArray: return "array of integers";
    case ValueType::StringArray: return "array of strings";
  }
  return "?";
}

std::string key_path_string(const std::vector<std::string>& path) {
  std::string out;
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (i) out += '.';
    out += needs_quotes(path[i]) ? "\"" + path[i] + "\"" : path[i];
  }
  return out;
}

Schema& Schema::add(KeySpec spec) {
  keys_.push_back(std::move(spec));
  return *this;
}

Schema& Schema::add_table(std::vector<std::string> path) {
  tables_.push_back(std::move(path));
  return *this;
}

const KeySpec* Schema::find(const std::vector<std::string>& path) const {
  for (const auto& k : keys_)
    if (k.path == path) return &k;
  return nullptr;
}

Schema& Schema::add_table_array(std::vector<std::string> path) {
  arrays_.push_back(std::move(path));
  return *this;
}

bool Schema::is_table_array(const std::vector<std::string>& path) const {
  for (const auto& a : arrays_)
    if (a == path) return true;
  return false;
}

bool Schema::is_table(const std::vector<std::string>& path) const {
  for (const auto& t : tables_)
    if (is_prefix(path, t)) return true;
  for (const auto& k : keys_)
    if (k.path.size() > path.size() && is_prefix(path, k.path)) return true;
  return false;
}

const KeySpec* Schema::find_dotted(std::string_view dotted) const {
  for (const auto& k : keys_) {
    if (key_path_string(k.path) == dotted) return &k;
    std::string plain;
    for (std::size_t i = 0; i < k.path.size(); ++i) plain += (i ? "." : "") + k.path[i];
    if (plain == dotted) return &k;
  }
  return nullptr;
}

Config Config::load(const Schema& schema, const std::string& path,
                    const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": is a directory, not an experiment file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const auto resolved = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec).string();
    throw InputError(path + ": cannot open experiment file for reading (" + (resolved.empty() ? path : resolved) +
                     ": " + std::strerror(err ? err : ENOENT) + ")");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read error");
  return parse(schema, ss.str(), path, overrides);
}

Config Config::parse(const Schema& schema, std::string_view text, const std::string& source_name,
                     const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.source_ = source_name;
  toml::table tbl;
  try {
    tbl = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw InputError(source_name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                     ": malformed TOML: " + std::string(e.description()));
  }

  for (const auto& k : schema.keys()) {
    if (k.array_element) continue;
    auto name = key_path_string(k.path);
    cfg.order_.push_back(name);
    cfg.paths_[name] = k.path;
    if (!k.optional_table) cfg.values_[name] = k.default_value;
    cfg.given_[name] = false;
  }

  // Walk the file: every leaf must be a schema key.
  std::vector<std::string> path;
  auto walk = [&](auto&& self, const toml::table& t) -> void {
    for (const auto& [key, node] : t) {
      path.emplace_back(key.str());
      if (const KeySpec* spec = schema.find(path); spec && !spec->array_element) {
        auto name = key_path_string(path);
        cfg.values_[name] = convert(*spec, node, where(source_name, node));
        cfg.given_[name] = true;
      } else if (schema.is_table_array(path)) {
        // [[a.b]]: every table's keys from the array's element keys, the rest defaulted.
        const std::string name = key_path_string(path);
        if (!node.is_array_of_tables())
          throw InputError(where(source_name, node) + ": key '" + name + "': expected an array of tables ([[" + name +
                           "]]), found " + describe_node(node));
        auto& elems = cfg.arrays_[name];
        for (const auto& item : *node.as_array()) {
          std::map<std::string, Value> e;
          for (const auto& k : schema.keys())
            if (k.array_element && k.path.size() == path.size() + 1 && is_prefix(path, k.path)) e[k.path.back()] = k.default_value;
          for (const auto& [ek, ev] : *item.as_table()) {
            auto ep = path;
            ep.emplace_back(ek.str());
            const KeySpec* es = schema.find(ep);
            if (!es || !es->array_element)
              throw InputError(where(source_name, ev) + ": unknown key '" + std::string(ek.str()) + "' in [[" + name + "]]" +
                               nearest_key_hint(schema, key_path_string(ep)));
            e[ep.back()] = convert(*es, ev, where(source_name, ev));
          }
          elems.push_back(std::move(e));
        }
        cfg.given_[name] = true;
      } else if (node.is_table() && schema.is_table(path)) {
        self(self, *node.as_table());
      } else {
        throw InputError(where(source_name, node) + ": unknown key '" + key_path_string(path) + "'" +
                         (node.is_table() ? " (table)" : "") + nearest_key_hint(schema, key_path_string(path)));
      }
      path.pop_back();
    }
  };
  walk(walk, tbl);

  for (const auto& ov : overrides) {
    auto eq = ov.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError("--set " + ov + ": expected key.path=value");
    std::string key = ov.substr(0, eq), val = ov.substr(eq + 1);
    const KeySpec* spec = schema.find_dotted(key);
    if (!spec) throw InputError("--set " + ov + ": unknown key '" + key + "'" + nearest_key_hint(schema, key));
    if (spec->array_element) {
      const std::string arr = key_path_string(std::vector<std::string>(spec->path.begin(), spec->path.end() - 1));
      throw InputError("--set " + ov + ": '" + arr + "' is an array of tables ([[" + arr + "]]): set it in the experiment file");
    }
    const std::string loc = "--set " + ov;
    toml::table vt;
    bool parsed = false;
    try {
      vt = toml::parse("v = " + val, std::string_view("--set"));
      parsed = true;
    } catch (const toml::parse_error&) {
    }
    Config::Value v;
    if (parsed && !(spec->type == ValueType::String && !vt["v"].is_string())) {
      v = convert(*spec, *vt.get("v"), loc);
    } else if (spec->type == ValueType::String) {
      toml::value<std::string> sv(val);
      v = convert(*spec, sv, loc);
    } else if (spec->type == ValueType::StringArray) {  // bare words, comma-separated: a,b
      toml::value<std::string> sv(val);
      v = convert(*spec, sv, loc);
    } else {
      throw InputError(loc + ": key '" + key_path_string(spec->path) + "': expected " +
                       value_type_name(spec->type) + ", found \"" + val + "\"");
    }
    auto name = key_path_string(spec->path);
    cfg.values_[name] = std::move(v);
    cfg.given_[name] = true;
  }
  return cfg;
}

const Config::Value& Config::get(std::string_view dotted) const {
  auto it = values_.find(std::string(dotted));
  KVGRID_CHECK(it != values_.end(), "configuration key '", dotted, "' is not in the schema or was not given");
  return it->second;
}

std::int64_t Config::get_int(std::string_view k) const { return std::get<std::int64_t>(get(k)); }
double Config::get_float(std::string_view k) const { return std::get<double>(get(k)); }
bool Config::get_bool(std::string_view k) const { return std::get<bool>(get(k)); }
const std::string& Config::get_string(std::string_view k) const { return std::get<std::string>(get(k)); }
const std::vector<std::int64_t>& Config::get_int_array(std::string_view k) const {
  return std::get<std::vector<std::int64_t>>(get(k));
}
const std::vector<std::string>& Config::get_string_array(std::string_view k) const {
  return std::get<std::vector<std::string>>(get(k));
}

std::size_t Config::elements(std::string_view a) const {
  auto it = arrays_.find(std::string(a));
  return it == arrays_.end() ? 0 : it->second.size();
}

const Config::Value& Config::element(std::string_view a, std::size_t i, const std::string& key) const {
  auto it = arrays_.find(std::string(a));
  KVGRID_CHECK(it != arrays_.end() && i < it->second.size() && it->second[i].count(key), "configuration key '", a, "[", i,
               "].", key, "' was not read");
  return it->second[i].at(key);
}

bool Config::given(std::string_view k) const {
  auto it = given_.find(std::string(k));
  return it != given_.end() && it->second;
}

bool Config::table_given(std::string_view prefix) const {
  std::string p = std::string(prefix) + ".";
  for (const auto& [name, g] : given_)
    if (g && name.compare(0, p.size(), p) == 0) return true;
  return false;
}

std::string Config::effective_toml() const {
  std::ostringstream os;
  std::string current_table = "\x01";
  for (const auto& name : order_) {
    auto it = values_.find(name);
    if (it == values_.end()) continue;
    const auto& path = paths_.at(name);
    std::vector<std::string> table(path.begin(), path.end() - 1);
    std::string tname = key_path_string(table);
    if (tname != current_table) {
      os << (current_table == "\x01" ? "" : "\n") << "[" << tname << "]\n";
      current_table = tname;
    }
    os << key_path_string({path.back()}) << " = " << format_value(it->second) << "\n";
  }
  for (const auto& [name, elems] : arrays_)
    for (const auto& e : elems) {
      os << "\n[[" << name << "]]\n";
      for (const auto& [k, v] : e) os << key_path_string({k}) << " = " << format_value(v) << "\n";
    }
  return os.str();
}

}  // namespace kvgrid

// Sample groups (drive, video, scene) and the sequence-disjoint split (see dataset.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "lightseg/dataset.h"
#include "data/two_column_file.h"

namespace lightseg {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> comma_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ','))
    if (!x.empty()) out.push_back(x);
  return out;
}

// "file:PATH": image → group, by the image's path (as a list file gives it, relative to the
// dataset folder) and by its file name alone.
struct GroupFile {
  std::map<std::string, std::string> by_path, by_name;
  std::map<std::string, int> name_count;  // a file name given twice cannot identify a sample

  GroupFile(const std::string& path, const std::string& root) {
    fs::path p(path);
    if (!fs::exists(p) && p.is_relative() && fs::exists(fs::path(root) / p)) p = fs::path(root) / p;
    for_each_two_column_line(p.string(), "image group", "group file '" + path + "' cannot be opened",
                             [&](const std::string& image, const std::string& group) {
                               fs::path q(image);
                               if (q.is_relative()) q = fs::path(root) / q;
                               by_path[q.lexically_normal().string()] = group;
                               const std::string name = fs::path(image).filename().string();
                               by_name[name] = group;
                               ++name_count[name];
                             });
  }
  std::string operator()(const std::string& image) const {
    auto it = by_path.find(fs::path(image).lexically_normal().string());
    if (it != by_path.end()) return it->second;
    const std::string name = fs::path(image).filename().string();
    auto jt = by_name.find(name);
    if (jt != by_name.end() && name_count.at(name) == 1) return jt->second;
    throw std::runtime_error("image '" + image + "' is not in the group file");
  }
};

}  // namespace

SegDataset SegDataset::subset(const std::vector<size_t>& indices) const {
  SegDataset d = *this;
  d.samples_.clear();
  for (size_t i : indices) d.samples_.push_back(samples_.at(i));
  return d;
}

std::vector<std::string> SegDataset::groups(const std::string& group_by) const {
  const std::string rule = group_by.empty() ? (kind_ == "cityscapes" ? "dir" : "prefix") : group_by;
  std::vector<std::string> out;
  out.reserve(samples_.size());
  if (rule == "prefix") {
    for (const auto& s : samples_) {
      const std::string name = fs::path(s.image).filename().string();
      const size_t u = name.find('_');
      if (u == 0 || u == std::string::npos)
        throw std::runtime_error("group_by prefix: image '" + s.image +
                                 "' has no '_' in its file name (the group is the name up to the first '_'); "
                                 "try group_by dir, regex:PATTERN or file:PATH");
      out.push_back(name.substr(0, u));
    }
  } else if (rule == "dir") {
    for (const auto& s : samples_) out.push_back(fs::path(s.image).parent_path().filename().string());
  } else if (rule.rfind("regex:", 0) == 0) {
    const std::string pat = rule.substr(6);
    std::regex re;
    try {
      re = std::regex(pat);
    } catch (const std::regex_error& e) {
      throw std::invalid_argument("group_by regex: '" + pat + "' is not a valid regular expression (" + e.what() + ")");
    }
    for (const auto& s : samples_) {
      const std::string name = fs::path(s.image).filename().string();
      std::smatch m;
      if (!std::regex_search(name, m, re))
        throw std::runtime_error("group_by regex: '" + pat + "' does not match the image file name '" + name + "'");
      out.push_back(m.size() > 1 ? m[1].str() : m[0].str());
      if (out.back().empty())
        throw std::runtime_error("group_by regex: '" + pat + "' gives an empty group for '" + name + "'");
    }
  } else if (rule.rfind("file:", 0) == 0) {
    // PATH as given (relative to the working folder), else relative to the dataset folder.
    const std::string path = rule.substr(5);
    if (path.empty()) throw std::invalid_argument("group_by file: needs a path (file:PATH)");
    GroupFile gf(path, root_);
    for (const auto& s : samples_) out.push_back(gf(s.image));
  } else {
    throw std::invalid_argument("unknown group_by '" + rule + "' (expected prefix, dir, regex:PATTERN or file:PATH)");
  }
  return out;
}

std::string pool_splits(const std::string& a, const std::string& b) {
  std::vector<std::string> names;
  for (const auto& spec : {a, b})
    for (const auto& n : comma_list(spec)) {
      std::vector<std::string> parts = n == "trainval" ? std::vector<std::string>{"train", "val"} : std::vector<std::string>{n};
      for (const auto& p : parts)
        if (std::find(names.begin(), names.end(), p) == names.end()) names.push_back(p);
    }
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

std::vector<std::pair<std::string, size_t>> group_counts(const std::vector<std::string>& groups) {
  std::vector<std::pair<std::string, size_t>> out;
  for (const auto& g : groups) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == g; });
    if (it == out.end()) out.push_back({g, 1});
    else ++it->second;
  }
  return out;
}

std::string describe_groups(const std::vector<std::pair<std::string, size_t>>& counts) {
  std::string s;
  for (const auto& [g, n] : counts) s += (s.empty() ? "" : ", ") + g + " " + std::to_string(n);
  return s;
}

std::string GroupSplit::describe() const {
  return "train " + std::to_string(train.size()) + " images (" + describe_groups(train_groups) + "), val " +
         std::to_string(val.size()) + " images (" + describe_groups(val_groups) + ")";
}

GroupSplit split_by_groups(const SegDataset& pooled, const std::string& group_by,
                           const std::vector<std::string>& val_groups) {
  const auto groups = pooled.groups(group_by);
  const auto counts = group_counts(groups);
  const std::string rule = group_by.empty() ? (pooled.kind() == "cityscapes" ? "dir" : "prefix") : group_by;
  const std::string have = "the groups (group_by " + rule + ", images) are: " + describe_groups(counts);
  if (val_groups.empty()) throw std::invalid_argument("val_groups is empty; " + have);
  for (const auto& v : val_groups)
    if (std::none_of(counts.begin(), counts.end(), [&](const auto& c) { return c.first == v; }))
      throw std::invalid_argument("val group '" + v + "' has no image; " + have);
  std::vector<size_t> tr, va;
  for (size_t i = 0; i < groups.size(); ++i)
    (std::find(val_groups.begin(), val_groups.end(), groups[i]) != val_groups.end() ? va : tr).push_back(i);
  if (tr.empty()) throw std::invalid_argument("val_groups hold out every group: no image is left to train on; " + have);
  GroupSplit s{pooled.subset(tr), pooled.subset(va), {}, {}};
  for (const auto& c : counts)
    (std::find(val_groups.begin(), val_groups.end(), c.first) != val_groups.end() ? s.val_groups : s.train_groups).push_back(c);
  return s;
}

}  // namespace lightseg

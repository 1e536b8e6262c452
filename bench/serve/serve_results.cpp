// What `flashstep serve --json` records and writes (serve_results.hpp).
#include "serve_results.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace flashstep::bench {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return -1;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// A measured value, or null where it is negative (not measured).
std::string opt_number(double x) { return x < 0 ? "null" : json_number(x); }

std::string json_bool(bool b) { return b ? "true" : "false"; }

// A goal's ratio, always with a fraction ("1.0", not "1": readers take it as a float), or
// null where it is negative (not measured).
std::string ratio_number(double x) {
  if (x < 0 || !std::isfinite(x)) return "null";
  std::string s = json_number(x);
  return s.find_first_of(".e") == std::string::npos ? s + ".0" : s;
}

const char* const kStepColumns[] = {"step",      "decodes",       "prefills",       "tokens",       "kv_flat",
                                    "kv_unique", "graph_batch",   "graph_launches", "wall_us",      "host_us",
                                    "embed_us",  "projection_us", "attention_us",   "logits_us",    "sampling_us",
                                    "total_us",  "floor_us",      "decode_stage",   "prefill_stage"};

std::string step_row(const StepRecord& s) {
  std::ostringstream o;
  o << "[" << s.step << ", " << s.decodes << ", " << s.prefills << ", " << s.tokens << ", " << s.kv_flat << ", "
    << s.kv_unique << ", " << s.graph_batch << ", " << s.graph_launches << ", " << json_number(s.wall_us);
  for (double x :
       {s.host_us, s.embed_us, s.projection_us, s.attention_us, s.logits_us, s.sampling_us, s.total_us, s.floor_us})
    o << ", " << opt_number(x);
  o << ", " << json_string(s.decode_stage) << ", " << json_string(s.prefill_stage) << "]";
  return o.str();
}

}  // namespace

DecodeSummary summarize_decode(const VariantRecord& v, int64_t batch, int64_t slot_bytes) {
  DecodeSummary d;
  std::vector<double> wall, floor, ratio, flat, unique;
  std::vector<double> host, embed, proj, attn, logits, sampling, total;
  for (const StepRecord& s : v.steps_recorded) {
    if (s.prefills != 0 || s.decodes != batch) continue;
    ++d.steps;
    wall.push_back(s.wall_us);
    flat.push_back(static_cast<double>(s.kv_flat * slot_bytes));
    unique.push_back(static_cast<double>(s.kv_unique * slot_bytes));
    if (s.floor_us > 0) {
      floor.push_back(s.floor_us);
      ratio.push_back(s.wall_us / s.floor_us);
    }
    if (s.total_us >= 0) {
      host.push_back(s.host_us), embed.push_back(s.embed_us), proj.push_back(s.projection_us);
      attn.push_back(s.attention_us), logits.push_back(s.logits_us), sampling.push_back(s.sampling_us);
      total.push_back(s.total_us);
    }
  }
  d.wall_us = median(wall);
  d.floor_us = median(floor);
  d.ratio = median(ratio);
  d.ratio_max = ratio.empty() ? -1 : *std::max_element(ratio.begin(), ratio.end());
  d.kv_bytes_flat = median(flat);
  d.kv_bytes_unique = median(unique);
  d.host_us = mean(host), d.embed_us = mean(embed), d.projection_us = mean(proj);
  d.attention_us = mean(attn), d.logits_us = mean(logits), d.sampling_us = mean(sampling);
  d.total_us = mean(total);
  return d;
}

std::vector<Goal> evaluate_goals(const ServeRecord& r) {
  const std::string b = std::to_string(r.goal_batch);
  Goal floor{"decode step at batch " + b + " with CUDA graphs: time / floor (median over the steps)", "<= 1.5"};
  Goal host{"host metadata and plan at batch " + b + " with CUDA graphs: share of the step (means)", "<= 0.10"};
  bool judged = false;
  for (const VariantRecord& v : r.variants) {
    if (v.name != "graphs") continue;
    judged = true;
    const DecodeSummary d = summarize_decode(v, r.goal_batch, r.slot_bytes);
    if (d.ratio > 0) floor.ratio = d.ratio, floor.met = d.ratio <= 1.5;
    if (d.total_us > 0) host.ratio = d.host_us / d.total_us, host.met = host.ratio <= 0.10;
  }
  if (!judged) return {};
  return {floor, host};
}

std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      case '\r': o += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          o += buf;
        } else {
          o += c;
        }
    }
  }
  return o + "\"";
}

std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[40];
  if (x == std::floor(x) && std::fabs(x) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", x);
  else std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string to_json(const ServeRecord& r) {
  std::ostringstream o;
  auto field = [&](const char* key, const std::string& value, bool comma = true) {
    o << "  " << json_string(key) << ": " << value << (comma ? ",\n" : "\n");
  };
  o << "{\n";
  field("format", json_string("flashstep results 1"));
  field("stage", json_string("09_engine"));
  field("what", json_string(r.what));
  for (const auto& [k, v] : {std::pair<const char*, const std::string*>{"device", &r.device},
                             {"commit", &r.commit},
                             {"tree", &r.tree},
                             {"command", &r.command},
                             {"date", &r.date},
                             {"note", &r.note}})
    field(k, v->empty() ? "null" : json_string(*v));
  field("ceilings", "{\"read_ceiling_GB/s\": " + json_number(r.read_gbps) +
                        ", \"launch_floor_1_us\": " + json_number(r.launch_floor_1_us) + "}");
  field("read_buffer_bytes", json_number(r.read_buffer_bytes));
  std::string config = "{";
  for (size_t i = 0; i < r.config.size(); ++i)
    config += (i ? ", " : "") + json_string(r.config[i].first) + ": " + r.config[i].second;
  field("config", config + "}");
  field("model_bytes", "{\"weight_bytes_per_decode_step\": " + json_number(static_cast<double>(r.weight_bytes)) +
                           ", \"kv_bytes_per_token_slot\": " + json_number(static_cast<double>(r.slot_bytes)) +
                           ", \"page_size\": " + json_number(static_cast<double>(r.page_size)) +
                           ", \"goal_batch\": " + json_number(static_cast<double>(r.goal_batch)) + "}");
  // the variants, each with its steps
  std::string columns = "[";
  for (size_t i = 0; i < std::size(kStepColumns); ++i) columns += (i ? ", " : "") + json_string(kStepColumns[i]);
  columns += "]";
  field("step_columns", columns);
  o << "  \"variants\": [\n";
  const double page_bytes = static_cast<double>(r.slot_bytes * r.page_size);
  for (size_t i = 0; i < r.variants.size(); ++i) {
    const VariantRecord& v = r.variants[i];
    o << "    {\"name\": " << json_string(v.name) << ", \"cuda_graphs\": " << json_bool(v.cuda_graphs)
      << ", \"prefix_sharing\": " << json_bool(v.prefix_sharing) << ", \"cascade\": " << json_bool(v.cascade)
      << ",\n     \"steps\": " << v.steps << ", \"tokens\": " << v.tokens << ", \"seconds\": " << json_number(v.seconds)
      << ", \"tokens_per_s\": " << (v.seconds > 0 ? json_number(static_cast<double>(v.tokens) / v.seconds) : "null")
      << ",\n     \"peak_pages\": " << v.peak_pages << ", \"pages_allocated\": " << v.pages_allocated
      << ", \"kv_bytes_peak\": " << json_number(static_cast<double>(v.peak_pages) * page_bytes)
      << ", \"kv_bytes_allocated\": " << json_number(static_cast<double>(v.pages_allocated) * page_bytes)
      << ", \"launch_floor_us\": " << opt_number(v.launch_floor_us) << ",\n     \"steps_recorded\": [";
    for (size_t s = 0; s < v.steps_recorded.size(); ++s)
      o << (s ? ",\n       " : "\n       ") << step_row(v.steps_recorded[s]);
    o << "]}" << (i + 1 < r.variants.size() ? ",\n" : "\n");
  }
  o << "  ],\n";
  // per variant, the decode steps at the goal's batch
  o << "  \"summary\": [\n";
  std::vector<std::string> rows;
  for (size_t i = 0; i < r.variants.size(); ++i) {
    const VariantRecord& v = r.variants[i];
    const DecodeSummary d = summarize_decode(v, r.goal_batch, r.slot_bytes);
    o << "    {\"variant\": " << json_string(v.name) << ", \"batch\": " << r.goal_batch
      << ", \"decode_steps\": " << d.steps << ", \"wall_us\": " << opt_number(d.wall_us)
      << ", \"floor_us\": " << opt_number(d.floor_us) << ", \"ratio\": " << opt_number(d.ratio)
      << ", \"ratio_max\": " << opt_number(d.ratio_max) << ",\n     \"host_us\": " << opt_number(d.host_us)
      << ", \"embed_us\": " << opt_number(d.embed_us) << ", \"projection_us\": " << opt_number(d.projection_us)
      << ", \"attention_us\": " << opt_number(d.attention_us) << ", \"logits_us\": " << opt_number(d.logits_us)
      << ", \"sampling_us\": " << opt_number(d.sampling_us) << ", \"total_us\": " << opt_number(d.total_us)
      << ",\n     \"kv_bytes_flat\": " << opt_number(d.kv_bytes_flat)
      << ", \"kv_bytes_unique\": " << opt_number(d.kv_bytes_unique) << "}"
      << (i + 1 < r.variants.size() ? ",\n" : "\n");
    const std::string prefix = "09_engine/" + r.what + "_" + v.name;
    if (v.steps > 0)
      rows.push_back("{\"name\": " + json_string(prefix + "/step_mean") +
                     ", \"impl\": \"09_engine\", \"shape\": " + json_string(r.what + "_" + v.name) +
                     ", \"median_us\": " + json_number(v.seconds * 1e6 / static_cast<double>(v.steps)) +
                     ", \"unit\": \"us\", \"tokens_per_s\": " +
                     (v.seconds > 0 ? json_number(static_cast<double>(v.tokens) / v.seconds) : "null") + "}");
    if (d.steps > 0)
      rows.push_back("{\"name\": " + json_string(prefix + "/decode_b" + std::to_string(r.goal_batch)) +
                     ", \"impl\": \"09_engine\", \"shape\": " + json_string(r.what + "_" + v.name) +
                     ", \"median_us\": " + json_number(d.wall_us) + ", \"unit\": \"us\", \"floor_us\": " +
                     opt_number(d.floor_us) + ", \"x_floor\": " + opt_number(d.ratio) + "}");
  }
  o << "  ],\n";
  o << "  \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) o << (i ? ",\n    " : "\n    ") << rows[i];
  o << "],\n";
  o << "  \"targets\": [";
  const std::vector<Goal> goals = evaluate_goals(r);
  for (size_t i = 0; i < goals.size(); ++i)
    o << (i ? ",\n    " : "\n    ") << "{\"what\": " << json_string(goals[i].what)
      << ", \"ratio\": " << ratio_number(goals[i].ratio) << ", \"goal\": " << json_string(goals[i].goal)
      << ", \"met\": " << (goals[i].met < 0 ? "null" : json_bool(goals[i].met == 1)) << "}";
  o << "],\n";
  const ShownStep& s = r.shown;
  if (s.step < 0) {
    field("shown_step", "null", false);
  } else {
    auto list = [](const std::vector<int32_t>& v) {
      std::string o = "[";
      for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
      return o + "]";
    };
    field("shown_step",
          "{\"step\": " + std::to_string(s.step) + ", \"arrays\": " + json_string(s.arrays) +
              ",\n    \"num_decodes\": " + std::to_string(s.num_decodes) + ", \"qo_indptr\": " + list(s.qo_indptr) +
              ", \"kv_indptr\": " + list(s.kv_indptr) + ", \"kv_indices\": " + list(s.kv_indices) +
              ", \"kv_last_page_len\": " + list(s.kv_last_page_len) + ",\n    \"decode_stage\": " +
              json_string(s.decode_stage) + ", \"prefill_stage\": " + json_string(s.prefill_stage) +
              ", \"graph_batch\": " + std::to_string(s.graph_batch) + ", \"group_size\": " +
              std::to_string(s.group_size) + ", \"shared_pages\": " + std::to_string(s.shared_pages) +
              ", \"cascade_option\": " + json_bool(s.cascade_option) + ",\n    \"sampled_requests\": " +
              list(s.sampled_requests) + ", \"sampled_tokens\": " + list(s.sampled_tokens) + "}",
          false);
  }
  o << "}\n";
  return o.str();
}

}  // namespace flashstep::bench

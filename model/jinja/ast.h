// The parsed template: expressions and statements as Jinja's parser builds them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/value.h"

namespace tandem::model::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kConst,     // value
    kName,      // name
    kList,      // children
    kTuple,     // children
    kDict,      // children: key, value, key, value...
    kAttr,      // children[0].name
    kItem,      // children[0][children[1]]
    kSlice,     // children[0][children[1]:children[2]:children[3]] (null parts absent)
    kCall,      // children[0](children[1..], kwargs)
    kFilter,    // children[0] | name(children[1..], kwargs); children[0] null in a filter block
    kTest,      // children[0] is name(children[1..], kwargs)
    kUnary,     // name: "-", "+", "not"
    kBinary,    // name: + - * / // % ** ~ and or
    kCompare,   // children[0] ops[0] children[1] ops[1] children[2]...
    kCondition  // children[1] if children[0] else children[2] (null: undefined)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Value value;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool known = true;  // a filter or test this interpreter has; unknown ones fail when evaluated
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (condition or null for else, body)
    kFor,          // targets in expr [if condition] body [else else_body]
    kSet,          // targets (or attribute: targets[0].targets[1]) = expr
    kSetBlock,     // targets[0] = rendered body [| filter]
    kMacro,        // name(params = defaults) body
    kCallBlock,    // expr: the call; params: caller's parameters; body: caller's body
    kFilterBlock,  // expr: filter chain over the body's output
    kBreak,
    kContinue,
    kGeneration  // {% generation %}: the body, as transformers' AssistantTracker renders it
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;       // output, iterable, value, call, filter chain
  ExprPtr condition;  // for ... if condition
  std::vector<std::string> targets;
  bool attribute = false;  // set ns.attr = ...
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro and caller parameters with defaults
};

struct Program {
  Body body;
};

}  // namespace tandem::model::jinja

"""Write the small fixtures the file tasks are tested and demoed on (run from the repo root).

    python data/make_fixtures.py

- ``data/gsm8k_fixture.jsonl``: 50 GSM8K-style word problems from seeded templates,
  ``{"question", "answer"}`` with the answer written GSM8K's way (steps, then ``#### N``).
- ``data/code_fixture.jsonl``: 30 small Python problems, ``{"prompt", "tests", "solution"}``;
  18 with assert tests (a function to write) and 12 with stdin/stdout tests (a program).
Written for this project; no rows are copied from any dataset.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jo"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies"]


def _math(rng: random.Random) -> dict:
    kind = rng.randrange(5)
    n, item = rng.choice(NAMES), rng.choice(ITEMS)
    if kind == 0:
        a, b, c = rng.randint(5, 40), rng.randint(2, 9), rng.randint(1, 20)
        q = f"{n} has {a} {item}. {n} buys {b} packs with {c} {item} in each pack. How many {item} does {n} have now?"
        steps, ans = f"{b} packs hold {b}*{c} = {b * c} {item}.\n{a}+{b * c} = {a + b * c}", a + b * c
    elif kind == 1:
        price, qty, paid = rng.randint(2, 15), rng.randint(2, 8), 0
        paid = price * qty + rng.randint(1, 30)
        q = f"A {item[:-1]} costs ${price}. {n} buys {qty} of them and pays with ${paid}. How much change does {n} get?"
        steps, ans = f"The cost is {qty}*{price} = {price * qty}.\n{paid}-{price * qty} = {paid - price * qty}", paid - price * qty
    elif kind == 2:
        per_day, days, give = rng.randint(3, 12), rng.randint(3, 9), rng.randint(1, 10)
        q = f"{n} reads {per_day} pages a day for {days} days, then skips {give} pages. How many pages did {n} read?"
        steps, ans = f"{per_day}*{days} = {per_day * days}.\n{per_day * days}-{give} = {per_day * days - give}", per_day * days - give
    elif kind == 3:
        total, groups = rng.randint(2, 12) * rng.randint(2, 9), 0
        groups = rng.choice([d for d in range(2, 10) if total % d == 0] or [1])
        q = f"{total} {item} are shared equally among {groups} friends. How many {item} does each friend get?"
        steps, ans = f"{total}/{groups} = {total // groups}", total // groups
    else:
        a, pct = rng.randint(2, 20) * 10, rng.choice([10, 20, 25, 50])
        q = f"A shop had {a} {item} and sold {pct}% of them. How many {item} are left?"
        sold = a * pct // 100
        steps, ans = f"{pct}% of {a} is {sold}.\n{a}-{sold} = {a - sold}", a - sold
    return {"question": q, "answer": f"{steps}\n#### {ans}"}


def _fn(prompt, name, solution, cases):
    return {"prompt": f"Write a Python function `{name}`. {prompt}", "solution": solution,
            "tests": [f"assert {name}({', '.join(map(repr, args))}) == {out!r}" for args, out in cases]}


def _io(prompt, solution, cases):
    return {"prompt": f"Write a Python program that reads standard input. {prompt}", "solution": solution,
            "tests": [{"input": i, "output": o} for i, o in cases]}


CODE = [
    _fn("Return the sum of two integers.", "add", "def add(a, b):\n    return a + b\n", [((1, 2), 3), ((-4, 4), 0), ((10, 5), 15)]),
    _fn("Return the larger of two numbers.", "bigger", "def bigger(a, b):\n    return a if a > b else b\n", [((1, 2), 2), ((7, -1), 7), ((3, 3), 3)]),
    _fn("Return the string reversed.", "reverse", "def reverse(s):\n    return s[::-1]\n", [(("abc",), "cba"), (("",), ""), (("ab a",), "a ba")]),
    _fn("Return True if n is prime.", "is_prime", "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n", [((2,), True), ((9,), False), ((97,), True), ((1,), False)]),
    _fn("Return n factorial.", "fact", "def fact(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r\n", [((0,), 1), ((5,), 120), ((10,), 3628800)]),
    _fn("Return the n-th Fibonacci number (fib(0)=0, fib(1)=1).", "fib", "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n", [((0,), 0), ((1,), 1), ((10,), 55), ((30,), 832040)]),
    _fn("Return the number of vowels (aeiou, lower case) in s.", "vowels", "def vowels(s):\n    return sum(c in 'aeiou' for c in s)\n", [(("hello",), 2), (("xyz",), 0), (("aeiou",), 5)]),
    _fn("Return the list sorted in decreasing order.", "desc", "def desc(xs):\n    return sorted(xs, reverse=True)\n", [(([3, 1, 2],), [3, 2, 1]), (([],), []), (([5, 5, 1],), [5, 5, 1])]),
    _fn("Return True if s reads the same backwards.", "is_pal", "def is_pal(s):\n    return s == s[::-1]\n", [(("racecar",), True), (("ab",), False), (("",), True)]),
    _fn("Return the greatest common divisor of a and b.", "gcd", "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n", [((12, 18), 6), ((7, 3), 1), ((0, 5), 5)]),
    _fn("Return a dict mapping each character of s to its count.", "counts", "def counts(s):\n    d = {}\n    for c in s:\n        d[c] = d.get(c, 0) + 1\n    return d\n", [(("aab",), {"a": 2, "b": 1}), (("",), {})]),
    _fn("Return the sum of the digits of a non-negative integer.", "digit_sum", "def digit_sum(n):\n    return sum(int(c) for c in str(n))\n", [((0,), 0), ((1234,), 10), ((999,), 27)]),
    _fn("Return the list without duplicates, keeping first occurrences in order.", "dedup", "def dedup(xs):\n    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n", [(([1, 2, 1, 3, 2],), [1, 2, 3]), (([],), [])]),
    _fn("Return (min, max) of a non-empty list as a tuple.", "min_max", "def min_max(xs):\n    return (min(xs), max(xs))\n", [(([3, 1, 2],), (1, 3)), (([5],), (5, 5))]),
    _fn("Return the number of words in s (split on whitespace).", "word_count", "def word_count(s):\n    return len(s.split())\n", [(("a b  c",), 3), (("",), 0)]),
    _fn("Return s with the first letter of each word capitalised.", "title", "def title(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n", [(("hello world",), "Hello World"), (("a",), "A")]),
    _fn("Return the running sums of a list.", "prefix_sums", "def prefix_sums(xs):\n    out, t = [], 0\n    for x in xs:\n        t += x\n        out.append(t)\n    return out\n", [(([1, 2, 3],), [1, 3, 6]), (([],), [])]),
    _fn("Return n written in binary without the 0b prefix.", "to_bin", "def to_bin(n):\n    return bin(n)[2:]\n", [((5,), "101"), ((0,), "0"), ((8,), "1000")]),
    _io("Print the sum of the two integers on the first line.", "a, b = map(int, input().split())\nprint(a + b)\n", [("1 2\n", "3\n"), ("-5 5\n", "0\n"), ("100 23\n", "123\n")]),
    _io("Print the line reversed.", "print(input()[::-1])\n", [("abc\n", "cba\n"), ("x\n", "x\n")]),
    _io("The first line has n; print the numbers 1..n, one per line.", "n = int(input())\nfor i in range(1, n + 1):\n    print(i)\n", [("3\n", "1\n2\n3\n"), ("1\n", "1\n")]),
    _io("Print the maximum of the integers on the first line.", "print(max(map(int, input().split())))\n", [("3 9 2\n", "9\n"), ("-1 -7\n", "-1\n")]),
    _io("Print YES if the integer is even, else NO.", "print('YES' if int(input()) % 2 == 0 else 'NO')\n", [("4\n", "YES\n"), ("7\n", "NO\n")]),
    _io("Print the line in upper case.", "print(input().upper())\n", [("abc\n", "ABC\n"), ("Hi there\n", "HI THERE\n")]),
    _io("The first line has n, then n integers on the next line; print their sum.", "input()\nprint(sum(map(int, input().split())))\n", [("3\n1 2 3\n", "6\n"), ("1\n9\n", "9\n")]),
    _io("Print the number of characters on the line.", "print(len(input()))\n", [("hello\n", "5\n"), ("\n", "0\n")]),
    _io("Print the integers on the line sorted ascending, space separated.", "print(*sorted(map(int, input().split())))\n", [("3 1 2\n", "1 2 3\n"), ("5\n", "5\n")]),
    _io("Print n squared for the integer n.", "n = int(input())\nprint(n * n)\n", [("7\n", "49\n"), ("-3\n", "9\n")]),
    _io("Print the words of the line in reverse order.", "print(' '.join(input().split()[::-1]))\n", [("a b c\n", "c b a\n"), ("one\n", "one\n")]),
    _io("Print the count of the letter 'a' on the line.", "print(input().count('a'))\n", [("banana\n", "3\n"), ("xyz\n", "0\n")]),
]


def main() -> None:
    rng = random.Random(20240601)
    with open(HERE / "gsm8k_fixture.jsonl", "w") as f:
        for _ in range(50):
            f.write(json.dumps(_math(rng)) + "\n")
    with open(HERE / "code_fixture.jsonl", "w") as f:
        for row in CODE:
            f.write(json.dumps(row) + "\n")
    print(f"wrote 50 math rows and {len(CODE)} code rows to {HERE}")


if __name__ == "__main__":
    main()

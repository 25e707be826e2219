"""Generates data/easy_python.jsonl: the demo's small set of easy Python tasks (falcon-rl).

Each task is HumanEval-shaped (signature + docstring as the prompt, so the function name is
given), with a reference solution as a complete program and 3-5 independent assert tests.
"Easy" is measured, not assumed: `falcon eval` with configs/demo.toml (held-out tasks) or
with its [eval] tags emptied (all tasks) gives the embedded model's start pass@1; docs/train.md
records the figures.

Rerun: python3 scripts/build-easy-tasks.py  (deterministic; checks every solution first)
"""
import json, os, subprocess, sys, tempfile, textwrap

TASKS = []


def task(name, params, doc, body, tests):
    doc = textwrap.dedent(doc).strip("\n")
    sig = f"def {name}({params}):\n" + textwrap.indent('"""' + doc + '\n"""', "    ") + "\n"
    body = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    TASKS.append(dict(id=f"easy/{name}", prompt=sig, entry_point=name,
                      tests=[t.strip() for t in tests], canonical_solution=sig + body,
                      tags=["easy"]))


# The train/held-out split is drawn in split(), seeded and blind to how any model does on
# the tasks. (Choosing held-out tasks by the start model's failures would bias the
# before/after comparison: noise alone flips more failures to passes than back.)
HELDOUT = 20

task("add", "a, b", "Return the sum of a and b.", "return a + b",
     ["assert add(1, 2) == 3", "assert add(-5, 5) == 0", "assert add(2.5, 0.5) == 3.0"])
task("subtract", "a, b", "Return a minus b.", "return a - b",
     ["assert subtract(5, 3) == 2", "assert subtract(0, 4) == -4", "assert subtract(-1, -1) == 0"])
task("multiply", "a, b", "Return the product of a and b.", "return a * b",
     ["assert multiply(3, 4) == 12", "assert multiply(-2, 5) == -10", "assert multiply(0, 9) == 0"])
task("square", "x", "Return x squared.", "return x * x",
     ["assert square(3) == 9", "assert square(-4) == 16", "assert square(0) == 0"])
task("cube", "x", "Return x to the power of three.", "return x ** 3",
     ["assert cube(2) == 8", "assert cube(-3) == -27", "assert cube(0) == 0"])
task("is_even", "n", "Return True if the integer n is even, otherwise False.", "return n % 2 == 0",
     ["assert is_even(4) is True", "assert is_even(7) is False", "assert is_even(0) is True",
      "assert is_even(-2) is True"])
task("is_odd", "n", "Return True if the integer n is odd, otherwise False.", "return n % 2 != 0",
     ["assert is_odd(3) is True", "assert is_odd(8) is False", "assert is_odd(-5) is True"])
task("absolute", "x", "Return the absolute value of x without using abs().",
     "return -x if x < 0 else x",
     ["assert absolute(-3) == 3", "assert absolute(4) == 4", "assert absolute(0) == 0"])
task("max_of_two", "a, b", "Return the larger of a and b.", "return a if a >= b else b",
     ["assert max_of_two(1, 2) == 2", "assert max_of_two(7, -7) == 7", "assert max_of_two(3, 3) == 3"])
task("min_of_three", "a, b, c", "Return the smallest of a, b and c.", "return min(a, b, c)",
     ["assert min_of_three(1, 2, 3) == 1", "assert min_of_three(5, -1, 0) == -1",
      "assert min_of_three(4, 4, 2) == 2"])
task("list_sum", "nums", "Return the sum of the numbers in the list nums (0 for an empty list).",
     "return sum(nums)",
     ["assert list_sum([1, 2, 3]) == 6", "assert list_sum([]) == 0", "assert list_sum([-1, 1, 5]) == 5"])
task("list_product", "nums", "Return the product of the numbers in nums (1 for an empty list).",
     "p = 1\nfor x in nums:\n    p *= x\nreturn p",
     ["assert list_product([2, 3, 4]) == 24", "assert list_product([]) == 1",
      "assert list_product([5, 0]) == 0"])
task("list_max", "nums", "Return the largest number in the non-empty list nums.", "return max(nums)",
     ["assert list_max([1, 5, 3]) == 5", "assert list_max([-4, -2, -9]) == -2", "assert list_max([7]) == 7"])
task("average", "nums", "Return the arithmetic mean of the non-empty list nums as a float.",
     "return sum(nums) / len(nums)",
     ["assert average([1, 2, 3]) == 2.0", "assert average([5]) == 5.0", "assert average([1, 2]) == 1.5"])
task("count_positive", "nums", "Return how many numbers in nums are strictly greater than zero.",
     "return sum(1 for x in nums if x > 0)",
     ["assert count_positive([1, -2, 3, 0]) == 2", "assert count_positive([]) == 0",
      "assert count_positive([-1, -5]) == 0"])
task("reverse_string", "s", "Return the string s reversed.", "return s[::-1]",
     ["assert reverse_string('abc') == 'cba'", "assert reverse_string('') == ''",
      "assert reverse_string('racecar') == 'racecar'"])
task("string_length", "s", "Return the number of characters in s without using len().",
     "n = 0\nfor _ in s:\n    n += 1\nreturn n",
     ["assert string_length('hello') == 5", "assert string_length('') == 0", "assert string_length('a b') == 3"])
task("to_upper", "s", "Return s with every letter converted to upper case.", "return s.upper()",
     ["assert to_upper('abc') == 'ABC'", "assert to_upper('Hi there') == 'HI THERE'", "assert to_upper('') == ''"])
task("first_char", "s", "Return the first character of s, or an empty string if s is empty.",
     "return s[:1]",
     ["assert first_char('hello') == 'h'", "assert first_char('') == ''", "assert first_char('x') == 'x'"])
task("last_element", "items", "Return the last element of the non-empty list items.", "return items[-1]",
     ["assert last_element([1, 2, 3]) == 3", "assert last_element(['a']) == 'a'",
      "assert last_element([None, 0]) == 0"])
task("count_vowels", "s", "Return the number of vowels (a, e, i, o, u, either case) in s.",
     "return sum(1 for c in s.lower() if c in 'aeiou')",
     ["assert count_vowels('hello') == 2", "assert count_vowels('xyz') == 0",
      "assert count_vowels('AEIOU') == 5", "assert count_vowels('') == 0"])
task("is_palindrome", "s", "Return True if the string s reads the same forwards and backwards.",
     "return s == s[::-1]",
     ["assert is_palindrome('racecar') is True", "assert is_palindrome('abc') is False",
      "assert is_palindrome('') is True", "assert is_palindrome('abba') is True"])
task("factorial", "n", "Return n! for a non-negative integer n (0! is 1).",
     "r = 1\nfor i in range(2, n + 1):\n    r *= i\nreturn r",
     ["assert factorial(0) == 1", "assert factorial(5) == 120", "assert factorial(1) == 1"])
task("fibonacci", "n",
     "Return the n-th Fibonacci number, where fibonacci(0) == 0 and fibonacci(1) == 1.",
     "a, b = 0, 1\nfor _ in range(n):\n    a, b = b, a + b\nreturn a",
     ["assert fibonacci(0) == 0", "assert fibonacci(1) == 1", "assert fibonacci(10) == 55",
      "assert fibonacci(2) == 1"])
task("sum_to_n", "n", "Return 1 + 2 + ... + n for a non-negative integer n (0 for n == 0).",
     "return n * (n + 1) // 2",
     ["assert sum_to_n(0) == 0", "assert sum_to_n(4) == 10", "assert sum_to_n(100) == 5050"])
task("celsius_to_fahrenheit", "c", "Convert a temperature from Celsius to Fahrenheit.",
     "return c * 9 / 5 + 32",
     ["assert celsius_to_fahrenheit(0) == 32", "assert celsius_to_fahrenheit(100) == 212",
      "assert celsius_to_fahrenheit(-40) == -40"])
task("is_positive", "x", "Return True if x is greater than zero, otherwise False.", "return x > 0",
     ["assert is_positive(3) is True", "assert is_positive(0) is False", "assert is_positive(-2) is False"])
task("double_list", "nums", "Return a new list with every number in nums multiplied by 2.",
     "return [2 * x for x in nums]",
     ["assert double_list([1, 2, 3]) == [2, 4, 6]", "assert double_list([]) == []",
      "assert double_list([-1]) == [-2]"])
task("filter_even", "nums", "Return a list of the even numbers in nums, in their original order.",
     "return [x for x in nums if x % 2 == 0]",
     ["assert filter_even([1, 2, 3, 4]) == [2, 4]", "assert filter_even([1, 3]) == []",
      "assert filter_even([0, -2]) == [0, -2]"])
task("count_occurrences", "items, x", "Return how many times x appears in the list items.",
     "return items.count(x)",
     ["assert count_occurrences([1, 2, 1], 1) == 2", "assert count_occurrences([], 3) == 0",
      "assert count_occurrences(['a', 'b'], 'c') == 0"])
task("contains", "items, x", "Return True if x is an element of the list items.", "return x in items",
     ["assert contains([1, 2, 3], 2) is True", "assert contains([], 1) is False",
      "assert contains(['a'], 'b') is False"])
task("remove_duplicates", "items",
     "Return a list of the elements of items without duplicates, keeping the first occurrence order.",
     "seen = set()\nout = []\nfor x in items:\n    if x not in seen:\n        seen.add(x)\n        out.append(x)\nreturn out",
     ["assert remove_duplicates([1, 2, 1, 3, 2]) == [1, 2, 3]", "assert remove_duplicates([]) == []",
      "assert remove_duplicates(['b', 'a', 'b']) == ['b', 'a']"])
task("word_count", "s", "Return the number of words in s, where words are separated by whitespace.",
     "return len(s.split())",
     ["assert word_count('hello world') == 2", "assert word_count('') == 0",
      "assert word_count('  one   two three ') == 3"])
task("capitalize_words", "s", "Return s with the first letter of every space-separated word in upper case.",
     "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
     ["assert capitalize_words('hello world') == 'Hello World'", "assert capitalize_words('a') == 'A'",
      "assert capitalize_words('') == ''"])
task("is_prime", "n", "Return True if the integer n is a prime number, otherwise False.",
     "if n < 2:\n    return False\ni = 2\nwhile i * i <= n:\n    if n % i == 0:\n        return False\n    i += 1\nreturn True",
     ["assert is_prime(2) is True", "assert is_prime(15) is False", "assert is_prime(13) is True",
      "assert is_prime(1) is False", "assert is_prime(0) is False"])
task("gcd", "a, b", "Return the greatest common divisor of the positive integers a and b.",
     "while b:\n    a, b = b, a % b\nreturn a",
     ["assert gcd(12, 18) == 6", "assert gcd(7, 5) == 1", "assert gcd(10, 10) == 10"])
task("digit_sum", "n", "Return the sum of the decimal digits of the non-negative integer n.",
     "return sum(int(d) for d in str(n))",
     ["assert digit_sum(123) == 6", "assert digit_sum(0) == 0", "assert digit_sum(9999) == 36"])
task("count_digits", "n", "Return the number of decimal digits in the non-negative integer n.",
     "return len(str(n))",
     ["assert count_digits(0) == 1", "assert count_digits(12345) == 5", "assert count_digits(10) == 2"])
task("reverse_list", "items", "Return a new list with the elements of items in reverse order.",
     "return items[::-1]",
     ["assert reverse_list([1, 2, 3]) == [3, 2, 1]", "assert reverse_list([]) == []",
      "assert reverse_list(['a', 'b']) == ['b', 'a']"])
task("sort_list", "nums", "Return a new list with the numbers of nums in ascending order.",
     "return sorted(nums)",
     ["assert sort_list([3, 1, 2]) == [1, 2, 3]", "assert sort_list([]) == []",
      "assert sort_list([5, -1, 5]) == [-1, 5, 5]"])
task("second_largest", "nums",
     "Return the second largest distinct value in nums, or None if there is none.",
     "vals = sorted(set(nums))\nreturn vals[-2] if len(vals) >= 2 else None",
     ["assert second_largest([1, 3, 2]) == 2", "assert second_largest([5, 5]) is None",
      "assert second_largest([4, 4, 1]) == 1", "assert second_largest([]) is None"])
task("join_words", "words", "Return the strings in the list words joined with single spaces.",
     "return ' '.join(words)",
     ["assert join_words(['a', 'b']) == 'a b'", "assert join_words([]) == ''",
      "assert join_words(['hi']) == 'hi'"])
task("char_frequency", "s", "Return a dict mapping each character of s to the number of times it occurs.",
     "d = {}\nfor c in s:\n    d[c] = d.get(c, 0) + 1\nreturn d",
     ["assert char_frequency('aab') == {'a': 2, 'b': 1}", "assert char_frequency('') == {}",
      "assert char_frequency('xyz') == {'x': 1, 'y': 1, 'z': 1}"])
task("is_leap_year", "year",
     "Return True if year is a leap year in the Gregorian calendar, otherwise False.",
     "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
     ["assert is_leap_year(2024) is True", "assert is_leap_year(1900) is False",
      "assert is_leap_year(2000) is True", "assert is_leap_year(2023) is False"])
task("fizzbuzz", "n",
     "Return 'FizzBuzz' if n is divisible by 15, 'Fizz' if by 3, 'Buzz' if by 5, otherwise str(n).",
     "if n % 15 == 0:\n    return 'FizzBuzz'\nif n % 3 == 0:\n    return 'Fizz'\nif n % 5 == 0:\n    return 'Buzz'\nreturn str(n)",
     ["assert fizzbuzz(15) == 'FizzBuzz'", "assert fizzbuzz(9) == 'Fizz'", "assert fizzbuzz(10) == 'Buzz'",
      "assert fizzbuzz(7) == '7'"])
task("square_list", "nums", "Return a new list with the square of every number in nums.",
     "return [x * x for x in nums]",
     ["assert square_list([1, 2, 3]) == [1, 4, 9]", "assert square_list([]) == []",
      "assert square_list([-2]) == [4]"])
task("starts_with", "s, prefix", "Return True if the string s starts with prefix.",
     "return s.startswith(prefix)",
     ["assert starts_with('hello', 'he') is True", "assert starts_with('hello', 'lo') is False",
      "assert starts_with('', '') is True"])
task("power", "base, exp", "Return base raised to the non-negative integer power exp.",
     "return base ** exp",
     ["assert power(2, 10) == 1024", "assert power(5, 0) == 1", "assert power(-3, 3) == -27"])
task("range_list", "n", "Return the list [0, 1, ..., n - 1] (empty for n <= 0).",
     "return list(range(n))",
     ["assert range_list(3) == [0, 1, 2]", "assert range_list(0) == []", "assert range_list(-2) == []"])
task("count_words_starting_with", "words, letter",
     "Return how many strings in words start with the given letter (case-sensitive).",
     "return sum(1 for w in words if w.startswith(letter))",
     ["assert count_words_starting_with(['apple', 'avocado', 'banana'], 'a') == 2",
      "assert count_words_starting_with([], 'a') == 0",
      "assert count_words_starting_with(['Apple'], 'a') == 0"])
task("merge_lists", "a, b", "Return a new list with the elements of a followed by the elements of b.",
     "return a + b",
     ["assert merge_lists([1], [2, 3]) == [1, 2, 3]", "assert merge_lists([], []) == []",
      "assert merge_lists(['x'], []) == ['x']"])
task("dict_keys_sorted", "d", "Return the keys of the dict d as a sorted list.", "return sorted(d)",
     ["assert dict_keys_sorted({'b': 1, 'a': 2}) == ['a', 'b']", "assert dict_keys_sorted({}) == []",
      "assert dict_keys_sorted({3: 0, 1: 0}) == [1, 3]"])
task("clamp", "x, lo, hi", "Return x limited to the closed range [lo, hi].",
     "return max(lo, min(x, hi))",
     ["assert clamp(5, 0, 10) == 5", "assert clamp(-3, 0, 10) == 0", "assert clamp(42, 0, 10) == 10"])
task("sign", "x", "Return 1 if x is positive, -1 if x is negative and 0 if x is zero.",
     "return (x > 0) - (x < 0)",
     ["assert sign(5) == 1", "assert sign(-2) == -1", "assert sign(0) == 0"])
task("index_of", "items, x", "Return the index of the first occurrence of x in items, or -1 if absent.",
     "for i, v in enumerate(items):\n    if v == x:\n        return i\nreturn -1",
     ["assert index_of([4, 5, 6], 5) == 1", "assert index_of([], 1) == -1",
      "assert index_of([1, 1], 1) == 0"])
task("count_uppercase", "s", "Return the number of upper-case letters in s.",
     "return sum(1 for c in s if c.isupper())",
     ["assert count_uppercase('Hello World') == 2", "assert count_uppercase('abc') == 0",
      "assert count_uppercase('ABC') == 3"])
task("remove_spaces", "s", "Return s with every space character removed.", "return s.replace(' ', '')",
     ["assert remove_spaces('a b c') == 'abc'", "assert remove_spaces('') == ''",
      "assert remove_spaces('  x ') == 'x'"])
task("nth_power_sum", "nums, k", "Return the sum of each number in nums raised to the power k.",
     "return sum(x ** k for x in nums)",
     ["assert nth_power_sum([1, 2, 3], 2) == 14", "assert nth_power_sum([], 3) == 0",
      "assert nth_power_sum([2], 0) == 1"])
task("flatten", "lists", "Return one list with the elements of the inner lists of lists, in order.",
     "return [x for inner in lists for x in inner]",
     ["assert flatten([[1, 2], [3]]) == [1, 2, 3]", "assert flatten([]) == []",
      "assert flatten([[], ['a']]) == ['a']"])
task("running_sum", "nums", "Return the list of prefix sums of nums: out[i] = nums[0] + ... + nums[i].",
     "out = []\nt = 0\nfor x in nums:\n    t += x\n    out.append(t)\nreturn out",
     ["assert running_sum([1, 2, 3]) == [1, 3, 6]", "assert running_sum([]) == []",
      "assert running_sum([5, -5]) == [5, 0]"])
task("max_difference", "nums", "Return the largest value minus the smallest value of the non-empty list nums.",
     "return max(nums) - min(nums)",
     ["assert max_difference([1, 5, 3]) == 4", "assert max_difference([7]) == 0",
      "assert max_difference([-2, 2]) == 4"])
task("is_sorted", "nums", "Return True if nums is in non-decreasing order.",
     "return all(nums[i] <= nums[i + 1] for i in range(len(nums) - 1))",
     ["assert is_sorted([1, 2, 2, 3]) is True", "assert is_sorted([3, 1]) is False",
      "assert is_sorted([]) is True"])
task("common_elements", "a, b",
     "Return a sorted list of the distinct values that appear in both lists a and b.",
     "return sorted(set(a) & set(b))",
     ["assert common_elements([1, 2, 3], [2, 3, 4]) == [2, 3]", "assert common_elements([], [1]) == []",
      "assert common_elements([1, 1], [1]) == [1]"])
task("longest_word", "s",
     "Return the longest whitespace-separated word in s (the first one on ties), or '' if there is none.",
     "best = ''\nfor w in s.split():\n    if len(w) > len(best):\n        best = w\nreturn best",
     ["assert longest_word('a bbb cc') == 'bbb'", "assert longest_word('') == ''",
      "assert longest_word('ab cd') == 'ab'"])


def check():
    """Every reference solution passes every one of its tests (each test on its own)."""
    bad = []
    for t in TASKS:
        for test in t["tests"]:
            prog = t["canonical_solution"] + "\n" + test + "\n"
            r = subprocess.run([sys.executable, "-c", prog], capture_output=True, timeout=10)
            if r.returncode != 0:
                bad.append((t["id"], test, r.stderr.decode()[-300:]))
    if bad:
        for b in bad:
            print("FAIL", *b, file=sys.stderr)
        sys.exit(1)


def split():
    import random
    held = set(random.Random(20261130).sample(range(len(TASKS)), HELDOUT))
    for i, t in enumerate(TASKS):
        t["tags"] = ["easy", "heldout" if i in held else "train"]


def main():
    split()
    ids = [t["id"] for t in TASKS]
    assert len(ids) == len(set(ids)), "duplicate task ids"
    check()
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "easy_python.jsonl")
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(out), delete=False) as f:
        for t in TASKS:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(f.name, out)
    n_h = sum(1 for t in TASKS if "heldout" in t["tags"])
    print(f"wrote {len(TASKS)} tasks ({len(TASKS) - n_h} train, {n_h} heldout) to data/easy_python.jsonl")


if __name__ == "__main__":
    main()

"""Generates data/easy_python.jsonl: the demo's small set of easy Python tasks (falcon-rl),
and data/easy_python_heldout2.jsonl: a second, larger held-out set of the same kind.

Each task is HumanEval-shaped (signature + docstring as the prompt, so the function name is
given), with a reference solution as a complete program and 3-5 independent assert tests.
"Easy" is measured, not assumed: `falcon eval` with configs/demo.toml (held-out tasks) or
with its [eval] tags emptied (all tasks) gives the embedded model's start pass@1; docs/train.md
records the figures.

data/easy_python.jsonl holds 64 tasks, split (seeded, outcome-blind) into 44 "train" and 20
"heldout". 20 held-out tasks cannot tell apart checkpoints whose pass@1 differs by a few
points, so data/easy_python_heldout2.jsonl adds 100 NEW tasks of the same kind and difficulty
spread (about a third one-liners, a third simple loops/comprehensions, a third small
algorithms), all tagged "heldout2". They were written after the first benchmark results,
without looking at how any model does on them, and are never trained on: use them only for
evaluation. Adding them leaves data/easy_python.jsonl byte-identical (the first 64 tasks and
their split are untouched).

Rerun: python3 scripts/data/build-easy-tasks.py  (deterministic; checks every solution first)
"""
import json, os, subprocess, sys, tempfile, textwrap

TASKS = []           # -> data/easy_python.jsonl (train/heldout split drawn in split())
HELDOUT2_TASKS = []  # -> data/easy_python_heldout2.jsonl (all held out, tagged heldout2)


def task(name, params, doc, body, tests, into=TASKS, tags=("easy",)):
    doc = textwrap.dedent(doc).strip("\n")
    sig = f"def {name}({params}):\n" + textwrap.indent('"""' + doc + '\n"""', "    ") + "\n"
    body = textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
    into.append(dict(id=f"easy/{name}", prompt=sig, entry_point=name,
                     tests=[t.strip() for t in tests], canonical_solution=sig + body,
                     tags=list(tags)))


def task2(name, params, doc, body, tests):
    """task() for the second held-out set (data/easy_python_heldout2.jsonl)."""
    task(name, params, doc, body, tests, into=HELDOUT2_TASKS, tags=("easy", "heldout2"))


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


# Second held-out set: 100 new tasks, none trained on, none a copy of the 64 above. Written
# outcome-blind (not chosen by how any model does on them). Roughly a third one-liners, a third
# simple loops/comprehensions, a third small algorithms.
HELDOUT2 = 100

# -- one-liners: arithmetic, comparisons, string and list methods --
task2("negate", "x", "Return x with its sign flipped (the negation of x).", "return -x",
      ["assert negate(5) == -5", "assert negate(-3) == 3", "assert negate(0) == 0"])
task2("half", "x", "Return x divided by 2 as a float.", "return x / 2",
      ["assert half(4) == 2.0", "assert half(3) == 1.5", "assert half(-1) == -0.5", "assert half(0) == 0.0"])
task2("triple", "x", "Return x multiplied by three.", "return 3 * x",
      ["assert triple(2) == 6", "assert triple(-4) == -12", "assert triple(0) == 0"])
task2("rectangle_area", "width, height", "Return the area of a rectangle with the given width and height.",
      "return width * height",
      ["assert rectangle_area(3, 4) == 12", "assert rectangle_area(5, 0) == 0", "assert rectangle_area(1, 1) == 1"])
task2("rectangle_perimeter", "width, height",
      "Return the perimeter of a rectangle with the given width and height.",
      "return 2 * (width + height)",
      ["assert rectangle_perimeter(3, 4) == 14", "assert rectangle_perimeter(0, 0) == 0",
       "assert rectangle_perimeter(5, 1) == 12"])
task2("is_divisible", "a, b",
      "Return True if the integer a is divisible by the non-zero integer b, otherwise False.",
      "return a % b == 0",
      ["assert is_divisible(10, 5) is True", "assert is_divisible(10, 3) is False",
       "assert is_divisible(0, 7) is True", "assert is_divisible(-9, 3) is True"])
task2("last_digit", "n",
      "Return the last decimal digit of the integer n (for a negative n, that of its absolute value).",
      "return abs(n) % 10",
      ["assert last_digit(123) == 3", "assert last_digit(0) == 0", "assert last_digit(-47) == 7",
       "assert last_digit(10) == 0"])
task2("swap_case", "s",
      "Return s with upper-case letters made lower case and lower-case letters made upper case;\n"
      "other characters are unchanged.",
      "return s.swapcase()",
      ["assert swap_case('Hello') == 'hELLO'", "assert swap_case('') == ''",
       "assert swap_case('a1B!') == 'A1b!'"])
task2("repeat_string", "s, n", "Return s repeated n times (an empty string if n <= 0).", "return s * n",
      ["assert repeat_string('ab', 3) == 'ababab'", "assert repeat_string('x', 0) == ''",
       "assert repeat_string('x', -2) == ''", "assert repeat_string('', 5) == ''"])
task2("first_n", "items, n",
      "Return a list of the first n elements of items (all of them if items has fewer than n\n"
      "elements; an empty list if n <= 0).",
      "return items[:n] if n > 0 else []",
      ["assert first_n([1, 2, 3], 2) == [1, 2]", "assert first_n([1], 5) == [1]",
       "assert first_n([1, 2], 0) == []", "assert first_n([1, 2, 3], -1) == []"])
task2("surround", "s, c", "Return the string s with the string c added both before and after it.",
      "return c + s + c",
      ["assert surround('hi', '*') == '*hi*'", "assert surround('', '-') == '--'",
       "assert surround('a', '()') == '()a()'"])
task2("minutes_to_seconds", "m", "Return the number of seconds in m minutes.", "return m * 60",
      ["assert minutes_to_seconds(2) == 120", "assert minutes_to_seconds(0) == 0",
       "assert minutes_to_seconds(1.5) == 90.0"])
task2("is_empty", "items", "Return True if the list items has no elements, otherwise False.",
      "return len(items) == 0",
      ["assert is_empty([]) is True", "assert is_empty([0]) is False", "assert is_empty([None]) is False"])
task2("is_between", "x, lo, hi", "Return True if lo <= x <= hi (both ends included), otherwise False.",
      "return lo <= x <= hi",
      ["assert is_between(5, 1, 10) is True", "assert is_between(1, 1, 10) is True",
       "assert is_between(10, 1, 10) is True", "assert is_between(11, 1, 10) is False",
       "assert is_between(0, 1, 10) is False"])
task2("same_length", "a, b", "Return True if the strings a and b have the same number of characters.",
      "return len(a) == len(b)",
      ["assert same_length('abc', 'xyz') is True", "assert same_length('a', 'ab') is False",
       "assert same_length('', '') is True"])
task2("strip_whitespace", "s",
      "Return s without its leading and trailing whitespace (spaces, tabs, newlines);\n"
      "whitespace inside s is kept.",
      "return s.strip()",
      ["assert strip_whitespace('  hi  ') == 'hi'", "assert strip_whitespace('\\tab c\\n') == 'ab c'",
       "assert strip_whitespace('') == ''"])
task2("ascii_code", "c",
      "Return the integer code point of the single character c (its ASCII code for ASCII characters).",
      "return ord(c)",
      ["assert ascii_code('A') == 65", "assert ascii_code('a') == 97", "assert ascii_code('0') == 48"])
task2("char_from_code", "n", "Return the single-character string whose code point is the integer n.",
      "return chr(n)",
      ["assert char_from_code(65) == 'A'", "assert char_from_code(122) == 'z'",
       "assert char_from_code(32) == ' '"])
task2("xor", "a, b", "Return True if exactly one of the booleans a and b is True, otherwise False.",
      "return a != b",
      ["assert xor(True, False) is True", "assert xor(False, True) is True",
       "assert xor(True, True) is False", "assert xor(False, False) is False"])
task2("distance", "a, b",
      "Return the distance between the numbers a and b on the number line (never negative).",
      "return abs(a - b)",
      ["assert distance(3, 7) == 4", "assert distance(7, 3) == 4", "assert distance(-2, 2) == 4",
       "assert distance(5, 5) == 0"])
task2("hms_to_seconds", "h, m, s", "Return the total number of seconds in h hours, m minutes and s seconds.",
      "return h * 3600 + m * 60 + s",
      ["assert hms_to_seconds(1, 0, 0) == 3600", "assert hms_to_seconds(0, 2, 5) == 125",
       "assert hms_to_seconds(0, 0, 0) == 0", "assert hms_to_seconds(1, 1, 1) == 3661"])
task2("quotient_and_remainder", "a, b",
      "For integers a >= 0 and b > 0, return the tuple (q, r) where q is a divided by b rounded\n"
      "down and r is the remainder of that division.",
      "return (a // b, a % b)",
      ["assert quotient_and_remainder(17, 5) == (3, 2)", "assert quotient_and_remainder(10, 2) == (5, 0)",
       "assert quotient_and_remainder(0, 3) == (0, 0)", "assert quotient_and_remainder(2, 7) == (0, 2)"])
task2("first_word", "s", "Return the first whitespace-separated word in s, or '' if s has no words.",
      "words = s.split()\nreturn words[0] if words else ''",
      ["assert first_word('hello world') == 'hello'", "assert first_word('   leading spaces') == 'leading'",
       "assert first_word('') == ''", "assert first_word('   ') == ''"])
task2("middle_element", "items", "Return the middle element of the list items, whose length is odd.",
      "return items[len(items) // 2]",
      ["assert middle_element([1, 2, 3]) == 2", "assert middle_element(['a']) == 'a'",
       "assert middle_element([5, 4, 3, 2, 1]) == 3"])
task2("swap_pair", "pair", "Given a tuple pair of two elements (a, b), return the tuple (b, a).",
      "a, b = pair\nreturn (b, a)",
      ["assert swap_pair((1, 2)) == (2, 1)", "assert swap_pair(('x', 'y')) == ('y', 'x')",
       "assert swap_pair((0, 0)) == (0, 0)"])
task2("is_all_digits", "s",
      "Return True if s is non-empty and every character of s is one of the digits 0-9,\n"
      "otherwise False.",
      "return s != '' and all(c in '0123456789' for c in s)",
      ["assert is_all_digits('12345') is True", "assert is_all_digits('') is False",
       "assert is_all_digits('12a') is False", "assert is_all_digits('-5') is False",
       "assert is_all_digits(' 1') is False"])
task2("percent", "part, whole",
      "Return part as a percentage of the non-zero number whole, rounded to 2 decimal places.",
      "return round(part * 100 / whole, 2)",
      ["assert percent(1, 4) == 25.0", "assert percent(1, 3) == 33.33", "assert percent(0, 5) == 0.0",
       "assert percent(3, 2) == 150.0"])
task2("count_distinct", "items", "Return the number of distinct values in the list items (0 for an empty list).",
      "return len(set(items))",
      ["assert count_distinct([1, 2, 2, 3]) == 3", "assert count_distinct([]) == 0",
       "assert count_distinct(['a', 'a']) == 1"])
task2("zero_pad", "n, width",
      "Return the decimal string of the non-negative integer n, padded on the left with zeros to\n"
      "at least width characters (a longer number is not cut).",
      "return str(n).zfill(width)",
      ["assert zero_pad(7, 3) == '007'", "assert zero_pad(1234, 2) == '1234'", "assert zero_pad(0, 1) == '0'",
       "assert zero_pad(42, 0) == '42'"])
task2("every_other", "items", "Return a list of the elements of items at even indices (0, 2, 4, ...).",
      "return items[::2]",
      ["assert every_other([1, 2, 3, 4, 5]) == [1, 3, 5]", "assert every_other([]) == []",
       "assert every_other(['a', 'b']) == ['a']"])
task2("digit_name", "d",
      "Return the English name ('zero', 'one', ..., 'nine') of the integer d, where 0 <= d <= 9.",
      "return ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine'][d]",
      ["assert digit_name(0) == 'zero'", "assert digit_name(7) == 'seven'", "assert digit_name(9) == 'nine'"])
task2("round_down_to_multiple", "n, k",
      "Return the largest multiple of the positive integer k that is less than or equal to the\n"
      "non-negative integer n.",
      "return n - n % k",
      ["assert round_down_to_multiple(17, 5) == 15", "assert round_down_to_multiple(20, 5) == 20",
       "assert round_down_to_multiple(3, 10) == 0", "assert round_down_to_multiple(0, 4) == 0"])
task2("dict_get_default", "d, key, default",
      "Return d[key] if key is a key of the dict d, otherwise return default.",
      "return d[key] if key in d else default",
      ["assert dict_get_default({'a': 1}, 'a', 0) == 1", "assert dict_get_default({'a': 1}, 'b', 0) == 0",
       "assert dict_get_default({}, 'x', None) is None", "assert dict_get_default({'a': None}, 'a', 5) is None"])
task2("is_triangle", "a, b, c",
      "Return True if the positive lengths a, b and c can be the sides of a triangle with non-zero\n"
      "area, i.e. each one is strictly less than the sum of the other two; otherwise False.",
      "return a < b + c and b < a + c and c < a + b",
      ["assert is_triangle(3, 4, 5) is True", "assert is_triangle(1, 2, 3) is False",
       "assert is_triangle(1, 1, 5) is False", "assert is_triangle(5, 1, 1) is False",
       "assert is_triangle(2, 2, 2) is True"])

# -- simple loops and comprehensions over lists, strings and dicts --
task2("sum_of_evens", "nums", "Return the sum of the even numbers in nums (0 if there are none).",
      "return sum(x for x in nums if x % 2 == 0)",
      ["assert sum_of_evens([1, 2, 3, 4]) == 6", "assert sum_of_evens([]) == 0",
       "assert sum_of_evens([1, 3]) == 0", "assert sum_of_evens([-2, 5]) == -2"])
task2("sum_odd_positions", "nums",
      "Return the sum of the elements of nums at odd indices (1, 3, 5, ...); 0 if there are none.",
      "return sum(nums[1::2])",
      ["assert sum_odd_positions([10, 1, 20, 2]) == 3", "assert sum_odd_positions([5]) == 0",
       "assert sum_odd_positions([]) == 0", "assert sum_odd_positions([0, 7, 0]) == 7"])
task2("count_long_words", "words, n", "Return how many strings in words have more than n characters.",
      "return sum(1 for w in words if len(w) > n)",
      ["assert count_long_words(['a', 'abc', 'abcd'], 2) == 2", "assert count_long_words([], 1) == 0",
       "assert count_long_words(['ab'], 2) == 0"])
task2("word_lengths", "words", "Return a list with the length of each string in words, in order.",
      "return [len(w) for w in words]",
      ["assert word_lengths(['hi', 'there']) == [2, 5]", "assert word_lengths([]) == []",
       "assert word_lengths(['']) == [0]"])
task2("replace_negatives", "nums", "Return a new list like nums but with every negative number replaced by 0.",
      "return [x if x >= 0 else 0 for x in nums]",
      ["assert replace_negatives([1, -2, 3]) == [1, 0, 3]", "assert replace_negatives([]) == []",
       "assert replace_negatives([-1, -1]) == [0, 0]", "assert replace_negatives([0]) == [0]"])
task2("add_lists", "a, b",
      "Return a list whose i-th element is a[i] + b[i], for two number lists a and b of equal length.",
      "return [x + y for x, y in zip(a, b)]",
      ["assert add_lists([1, 2], [3, 4]) == [4, 6]", "assert add_lists([], []) == []",
       "assert add_lists([-1], [1]) == [0]"])
task2("dot_product", "a, b",
      "Return the dot product of the equal-length number lists a and b: the sum of a[i] * b[i]\n"
      "(0 for empty lists).",
      "return sum(x * y for x, y in zip(a, b))",
      ["assert dot_product([1, 2, 3], [4, 5, 6]) == 32", "assert dot_product([], []) == 0",
       "assert dot_product([2], [-3]) == -6"])
task2("index_of_max", "nums",
      "Return the index of the largest number in the non-empty list nums (the first such index on ties).",
      "best = 0\nfor i in range(1, len(nums)):\n    if nums[i] > nums[best]:\n        best = i\nreturn best",
      ["assert index_of_max([1, 5, 3]) == 1", "assert index_of_max([7]) == 0",
       "assert index_of_max([2, 9, 9]) == 1", "assert index_of_max([-1, -5]) == 0"])
task2("dict_from_lists", "keys, values",
      "Return a dict mapping keys[i] to values[i], for two lists of equal length whose keys are distinct.",
      "return dict(zip(keys, values))",
      ["assert dict_from_lists(['a', 'b'], [1, 2]) == {'a': 1, 'b': 2}", "assert dict_from_lists([], []) == {}",
       "assert dict_from_lists([1], ['x']) == {1: 'x'}"])
task2("invert_dict", "d", "Return a new dict mapping each value of the dict d to its key (the values of d are distinct).",
      "return {v: k for k, v in d.items()}",
      ["assert invert_dict({'a': 1, 'b': 2}) == {1: 'a', 2: 'b'}", "assert invert_dict({}) == {}",
       "assert invert_dict({'x': 'y'}) == {'y': 'x'}"])
task2("sum_dict_values", "d", "Return the sum of the values of the dict d, whose values are numbers (0 if d is empty).",
      "return sum(d.values())",
      ["assert sum_dict_values({'a': 1, 'b': 2}) == 3", "assert sum_dict_values({}) == 0",
       "assert sum_dict_values({'x': -5, 'y': 5}) == 0"])
task2("key_with_max_value", "d",
      "Return the key of the dict d with the largest value (the earliest-inserted such key on ties),\n"
      "or None if d is empty.",
      "best = None\nfor k in d:\n    if best is None or d[k] > d[best]:\n        best = k\nreturn best",
      ["assert key_with_max_value({'a': 1, 'b': 3, 'c': 2}) == 'b'", "assert key_with_max_value({}) is None",
       "assert key_with_max_value({'x': 5, 'y': 5}) == 'x'", "assert key_with_max_value({'only': -1}) == 'only'"])
task2("multiples_of", "n, k",
      "Return the list [n, 2 * n, ..., k * n] of the first k multiples of n (empty if k <= 0).",
      "return [n * i for i in range(1, k + 1)]",
      ["assert multiples_of(3, 4) == [3, 6, 9, 12]", "assert multiples_of(5, 0) == []",
       "assert multiples_of(-2, 2) == [-2, -4]", "assert multiples_of(7, 1) == [7]"])
task2("interleave", "a, b",
      "Return a list alternating the elements of the equal-length lists a and b:\n"
      "a[0], b[0], a[1], b[1], ...",
      "out = []\nfor x, y in zip(a, b):\n    out.append(x)\n    out.append(y)\nreturn out",
      ["assert interleave([1, 2], ['x', 'y']) == [1, 'x', 2, 'y']", "assert interleave([], []) == []",
       "assert interleave([0], [0]) == [0, 0]"])
task2("char_positions", "s, c",
      "Return the list of the indices at which the character c occurs in s, in increasing order.",
      "return [i for i, ch in enumerate(s) if ch == c]",
      ["assert char_positions('banana', 'a') == [1, 3, 5]", "assert char_positions('abc', 'z') == []",
       "assert char_positions('', 'a') == []", "assert char_positions('aa', 'a') == [0, 1]"])
task2("double_chars", "s", "Return s with every character written twice in place, e.g. 'ab' becomes 'aabb'.",
      "return ''.join(c + c for c in s)",
      ["assert double_chars('abc') == 'aabbcc'", "assert double_chars('') == ''",
       "assert double_chars('a b') == 'aa  bb'"])
task2("only_letters", "s", "Return s with every character that is not a letter a-z or A-Z removed.",
      "return ''.join(c for c in s if 'a' <= c <= 'z' or 'A' <= c <= 'Z')",
      ["assert only_letters('a1b2c3') == 'abc'", "assert only_letters('Hello, World!') == 'HelloWorld'",
       "assert only_letters('123') == ''", "assert only_letters('') == ''"])
task2("acronym", "s",
      "Return the first letters of the whitespace-separated words of s, in upper case and joined\n"
      "together ('' if s has no words).",
      "return ''.join(w[0].upper() for w in s.split())",
      ["assert acronym('portable network graphics') == 'PNG'", "assert acronym('') == ''",
       "assert acronym('as soon as possible') == 'ASAP'", "assert acronym('  Hello   world ') == 'HW'"])
task2("last_n", "items, n",
      "Return a list of the last n elements of items (all of them if items has fewer than n\n"
      "elements; an empty list if n <= 0).",
      "return items[-n:] if n > 0 else []",
      ["assert last_n([1, 2, 3], 2) == [2, 3]", "assert last_n([1], 5) == [1]",
       "assert last_n([1, 2, 3], 0) == []", "assert last_n([], 3) == []"])
task2("count_in_range", "nums, lo, hi", "Return how many numbers x in nums satisfy lo <= x <= hi (both ends included).",
      "return sum(1 for x in nums if lo <= x <= hi)",
      ["assert count_in_range([1, 5, 10, 15], 5, 10) == 2", "assert count_in_range([], 0, 1) == 0",
       "assert count_in_range([3, 3], 3, 3) == 2", "assert count_in_range([1, 2], 5, 9) == 0"])
task2("all_equal", "items",
      "Return True if all elements of items are equal to each other (True for an empty or\n"
      "one-element list), otherwise False.",
      "return all(x == items[0] for x in items)",
      ["assert all_equal([2, 2, 2]) is True", "assert all_equal([1, 2]) is False", "assert all_equal([]) is True",
       "assert all_equal(['a']) is True"])
task2("first_even", "nums", "Return the first even number in nums, or None if there is none.",
      "for x in nums:\n    if x % 2 == 0:\n        return x\nreturn None",
      ["assert first_even([1, 3, 4, 6]) == 4", "assert first_even([1, 3]) is None",
       "assert first_even([]) is None", "assert first_even([0]) == 0"])
task2("hamming_distance", "s, t",
      "Return the number of positions at which the equal-length strings s and t have different characters.",
      "return sum(1 for a, b in zip(s, t) if a != b)",
      ["assert hamming_distance('karolin', 'kathrin') == 3", "assert hamming_distance('', '') == 0",
       "assert hamming_distance('abc', 'abc') == 0", "assert hamming_distance('ab', 'ba') == 2"])
task2("row_sums", "matrix",
      "Return a list with the sum of each row of matrix, a list of lists of numbers\n"
      "(an empty row sums to 0).",
      "return [sum(row) for row in matrix]",
      ["assert row_sums([[1, 2], [3, 4]]) == [3, 7]", "assert row_sums([]) == []",
       "assert row_sums([[], [5]]) == [0, 5]"])
task2("prefix_strings", "s",
      "Return the list of all non-empty prefixes of s, shortest first, e.g. 'ab' gives ['a', 'ab'].",
      "return [s[:i] for i in range(1, len(s) + 1)]",
      ["assert prefix_strings('abc') == ['a', 'ab', 'abc']", "assert prefix_strings('') == []",
       "assert prefix_strings('x') == ['x']"])
task2("divisors", "n", "Return the list of the positive divisors of the positive integer n, in increasing order.",
      "return [d for d in range(1, n + 1) if n % d == 0]",
      ["assert divisors(12) == [1, 2, 3, 4, 6, 12]", "assert divisors(1) == [1]", "assert divisors(7) == [1, 7]"])
task2("grade", "score",
      "Return the letter grade for an integer score from 0 to 100: 'A' for 90 or more, 'B' for 80-89,\n"
      "'C' for 70-79, 'D' for 60-69 and 'F' below 60.",
      "if score >= 90:\n    return 'A'\nif score >= 80:\n    return 'B'\nif score >= 70:\n    return 'C'\n"
      "if score >= 60:\n    return 'D'\nreturn 'F'",
      ["assert grade(90) == 'A'", "assert grade(85) == 'B'", "assert grade(70) == 'C'", "assert grade(65) == 'D'",
       "assert grade(59) == 'F'"])
task2("sort_by_length", "words",
      "Return a new list of the strings in words sorted by length, shortest first; strings of equal\n"
      "length keep their original order.",
      "return sorted(words, key=len)",
      ["assert sort_by_length(['ccc', 'a', 'bb']) == ['a', 'bb', 'ccc']", "assert sort_by_length([]) == []",
       "assert sort_by_length(['bb', 'aa', 'c']) == ['c', 'bb', 'aa']"])
task2("alternating_sum", "nums", "Return nums[0] - nums[1] + nums[2] - nums[3] + ... (0 for an empty list).",
      "return sum(x if i % 2 == 0 else -x for i, x in enumerate(nums))",
      ["assert alternating_sum([1, 2, 3]) == 2", "assert alternating_sum([]) == 0", "assert alternating_sum([5]) == 5",
       "assert alternating_sum([1, 1, 1, 1]) == 0"])
task2("truncate", "s, n",
      "If s has more than n characters, return its first n characters followed by '...';\n"
      "otherwise return s unchanged.",
      "return s[:n] + '...' if len(s) > n else s",
      ["assert truncate('hello world', 5) == 'hello...'", "assert truncate('hi', 5) == 'hi'",
       "assert truncate('abc', 3) == 'abc'", "assert truncate('abc', 0) == '...'"])
task2("mask_string", "s",
      "Return s with every character except the last four replaced by '#'; a string of four\n"
      "characters or fewer is returned unchanged.",
      "return '#' * max(len(s) - 4, 0) + s[-4:]",
      ["assert mask_string('1234567890') == '######7890'", "assert mask_string('abcd') == 'abcd'",
       "assert mask_string('ab') == 'ab'", "assert mask_string('') == ''"])
task2("filter_dict_by_value", "d, threshold",
      "Return a new dict with only the items of d whose value is strictly greater than threshold.",
      "return {k: v for k, v in d.items() if v > threshold}",
      ["assert filter_dict_by_value({'a': 1, 'b': 5}, 2) == {'b': 5}", "assert filter_dict_by_value({}, 0) == {}",
       "assert filter_dict_by_value({'x': 3}, 3) == {}"])
task2("parse_numbers", "s",
      "Return the list of the integers written in s, separated by whitespace, e.g. '1 -2 30' gives\n"
      "[1, -2, 30] (an empty list if there are none).",
      "return [int(w) for w in s.split()]",
      ["assert parse_numbers('1 2 3') == [1, 2, 3]", "assert parse_numbers('') == []",
       "assert parse_numbers('  -4   10 ') == [-4, 10]"])
task2("identity_matrix", "n",
      "Return the n x n identity matrix as a list of n rows (lists): 1 on the main diagonal and 0\n"
      "elsewhere (an empty list for n == 0).",
      "return [[1 if i == j else 0 for j in range(n)] for i in range(n)]",
      ["assert identity_matrix(2) == [[1, 0], [0, 1]]", "assert identity_matrix(0) == []",
       "assert identity_matrix(1) == [[1]]", "assert identity_matrix(3) == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]"])
task2("list_difference", "a, b",
      "Return a list of the elements of a that do not appear in b, keeping their order and\n"
      "repetitions from a.",
      "return [x for x in a if x not in b]",
      ["assert list_difference([1, 2, 3, 2], [2]) == [1, 3]", "assert list_difference([], [1]) == []",
       "assert list_difference([1, 1], []) == [1, 1]", "assert list_difference(['a', 'b'], ['a', 'b']) == []"])

# -- small algorithms --
task2("lcm", "a, b", "Return the least common multiple of the positive integers a and b.",
      "x, y = a, b\nwhile y:\n    x, y = y, x % y\nreturn a * b // x",
      ["assert lcm(4, 6) == 12", "assert lcm(3, 5) == 15", "assert lcm(7, 7) == 7", "assert lcm(1, 9) == 9"])
task2("to_binary", "n",
      "Return the binary representation of the non-negative integer n as a string of 0s and 1s,\n"
      "without any prefix ('0' for n == 0).",
      "if n == 0:\n    return '0'\nbits = ''\nwhile n > 0:\n    bits = str(n % 2) + bits\n    n //= 2\nreturn bits",
      ["assert to_binary(5) == '101'", "assert to_binary(0) == '0'", "assert to_binary(8) == '1000'",
       "assert to_binary(1) == '1'"])
task2("from_binary", "s", "Return the integer value of s, a non-empty string of binary digits (0s and 1s).",
      "n = 0\nfor c in s:\n    n = n * 2 + (c == '1')\nreturn n",
      ["assert from_binary('101') == 5", "assert from_binary('0') == 0", "assert from_binary('1111') == 15",
       "assert from_binary('0010') == 2"])
task2("run_length_encode", "s",
      "Return the run-length encoding of s: each maximal run of one repeated character becomes that\n"
      "character followed by the run's length, e.g. 'aaabcc' becomes 'a3b1c2' ('' for an empty s).",
      "out = ''\ni = 0\nwhile i < len(s):\n    j = i\n    while j < len(s) and s[j] == s[i]:\n        j += 1\n"
      "    out += s[i] + str(j - i)\n    i = j\nreturn out",
      ["assert run_length_encode('aaabcc') == 'a3b1c2'", "assert run_length_encode('') == ''",
       "assert run_length_encode('abc') == 'a1b1c1'", "assert run_length_encode('zzzzzzzzzzzz') == 'z12'",
       "assert run_length_encode('aabaa') == 'a2b1a2'"])
task2("is_anagram", "a, b",
      "Return True if the strings a and b are made of exactly the same characters with the same\n"
      "counts, in any order (case-sensitive; spaces count as characters), otherwise False.",
      "return sorted(a) == sorted(b)",
      ["assert is_anagram('listen', 'silent') is True", "assert is_anagram('abc', 'abd') is False",
       "assert is_anagram('', '') is True", "assert is_anagram('aab', 'abb') is False",
       "assert is_anagram('Ab', 'ab') is False"])
task2("rotate_left", "items, k",
      "Return a new list with the elements of items rotated k positions to the left, for an integer\n"
      "k >= 0 that may exceed len(items), e.g. [1, 2, 3] rotated by 1 is [2, 3, 1]. An empty list\n"
      "gives an empty list.",
      "if not items:\n    return []\nk %= len(items)\nreturn items[k:] + items[:k]",
      ["assert rotate_left([1, 2, 3, 4], 1) == [2, 3, 4, 1]", "assert rotate_left([1, 2, 3], 3) == [1, 2, 3]",
       "assert rotate_left([1, 2, 3], 5) == [3, 1, 2]", "assert rotate_left([], 2) == []",
       "assert rotate_left([1, 2], 0) == [1, 2]"])
task2("transpose", "matrix",
      "Return the transpose of matrix, a non-empty list of rows (lists) of equal non-zero length:\n"
      "row i of the result is column i of matrix.",
      "return [[row[i] for row in matrix] for i in range(len(matrix[0]))]",
      ["assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]", "assert transpose([[1]]) == [[1]]",
       "assert transpose([[1, 2]]) == [[1], [2]]"])
task2("word_frequencies", "s",
      "Return a dict mapping each whitespace-separated word of s to the number of times it occurs\n"
      "(case-sensitive; {} if s has no words).",
      "d = {}\nfor w in s.split():\n    d[w] = d.get(w, 0) + 1\nreturn d",
      ["assert word_frequencies('a b a') == {'a': 2, 'b': 1}", "assert word_frequencies('') == {}",
       "assert word_frequencies('The the') == {'The': 1, 'the': 1}", "assert word_frequencies('  x  x ') == {'x': 2}"])
task2("is_power_of_two", "n",
      "Return True if the integer n is a power of two (1, 2, 4, 8, ...), otherwise False;\n"
      "zero and negative numbers are not powers of two.",
      "return n > 0 and n & (n - 1) == 0",
      ["assert is_power_of_two(1) is True", "assert is_power_of_two(16) is True", "assert is_power_of_two(12) is False",
       "assert is_power_of_two(0) is False", "assert is_power_of_two(-8) is False"])
task2("digital_root", "n",
      "Repeatedly replace the non-negative integer n by the sum of its decimal digits until a single\n"
      "digit remains, and return that digit.",
      "while n >= 10:\n    n = sum(int(d) for d in str(n))\nreturn n",
      ["assert digital_root(16) == 7", "assert digital_root(942) == 6", "assert digital_root(0) == 0",
       "assert digital_root(5) == 5", "assert digital_root(99999) == 9"])
task2("reverse_words", "s",
      "Return the whitespace-separated words of s in reverse order, joined by single spaces\n"
      "('' if s has no words).",
      "return ' '.join(s.split()[::-1])",
      ["assert reverse_words('hello big world') == 'world big hello'", "assert reverse_words('') == ''",
       "assert reverse_words('  one  two ') == 'two one'", "assert reverse_words('solo') == 'solo'"])
task2("caesar_shift", "s, k",
      "Return s with every lower-case letter a-z shifted k places forward in the alphabet, wrapping\n"
      "around from 'z' to 'a' (k >= 0, possibly larger than 26); all other characters are unchanged.",
      "out = ''\nfor c in s:\n    if 'a' <= c <= 'z':\n        c = chr((ord(c) - ord('a') + k) % 26 + ord('a'))\n"
      "    out += c\nreturn out",
      ["assert caesar_shift('abc', 1) == 'bcd'", "assert caesar_shift('xyz', 3) == 'abc'",
       "assert caesar_shift('Hi there!', 1) == 'Hj uifsf!'", "assert caesar_shift('abc', 26) == 'abc'",
       "assert caesar_shift('', 5) == ''"])
task2("prime_factors", "n",
      "Return the prime factors of the integer n >= 2 in non-decreasing order, each repeated as many\n"
      "times as it divides n, e.g. 12 gives [2, 2, 3].",
      "out = []\nd = 2\nwhile d * d <= n:\n    while n % d == 0:\n        out.append(d)\n        n //= d\n    d += 1\n"
      "if n > 1:\n    out.append(n)\nreturn out",
      ["assert prime_factors(12) == [2, 2, 3]", "assert prime_factors(13) == [13]", "assert prime_factors(2) == [2]",
       "assert prime_factors(100) == [2, 2, 5, 5]"])
task2("collatz_steps", "n",
      "Return how many steps it takes to reach 1 from the positive integer n, where one step replaces\n"
      "n by n // 2 if n is even and by 3 * n + 1 if n is odd (0 steps for n == 1).",
      "steps = 0\nwhile n != 1:\n    n = n // 2 if n % 2 == 0 else 3 * n + 1\n    steps += 1\nreturn steps",
      ["assert collatz_steps(1) == 0", "assert collatz_steps(2) == 1", "assert collatz_steps(6) == 8",
       "assert collatz_steps(27) == 111"])
task2("balanced_parens", "s",
      "Return True if s, a string made only of '(' and ')', is balanced: every '(' is closed by a\n"
      "later ')' and every ')' closes an earlier '('. The empty string is balanced.",
      "depth = 0\nfor c in s:\n    depth += 1 if c == '(' else -1\n    if depth < 0:\n        return False\n"
      "return depth == 0",
      ["assert balanced_parens('(())()') is True", "assert balanced_parens('') is True",
       "assert balanced_parens(')(') is False", "assert balanced_parens('(()') is False",
       "assert balanced_parens('())') is False"])
task2("chunk", "items, size",
      "Split items into consecutive lists of size elements each (size >= 1), the last of which may be\n"
      "shorter, and return the list of these lists ([] for an empty items).",
      "return [items[i:i + size] for i in range(0, len(items), size)]",
      ["assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]", "assert chunk([], 3) == []",
       "assert chunk([1, 2], 2) == [[1, 2]]", "assert chunk([1, 2, 3], 1) == [[1], [2], [3]]"])
task2("has_pair_with_sum", "nums, target",
      "Return True if two elements of nums at different positions add up to target, otherwise False.",
      "seen = set()\nfor x in nums:\n    if target - x in seen:\n        return True\n    seen.add(x)\nreturn False",
      ["assert has_pair_with_sum([1, 4, 6], 10) is True", "assert has_pair_with_sum([5], 10) is False",
       "assert has_pair_with_sum([5, 5], 10) is True", "assert has_pair_with_sum([], 0) is False",
       "assert has_pair_with_sum([1, 2, 3], 7) is False"])
task2("most_common_char", "s",
      "Return the character that occurs most often in s; on ties, the one whose first occurrence\n"
      "comes earliest in s. Return '' for an empty string.",
      "counts = {}\nfor c in s:\n    counts[c] = counts.get(c, 0) + 1\nbest = ''\nfor c in s:\n"
      "    if best == '' or counts[c] > counts[best]:\n        best = c\nreturn best",
      ["assert most_common_char('hello') == 'l'", "assert most_common_char('abab') == 'a'",
       "assert most_common_char('') == ''", "assert most_common_char('abcbc') == 'b'"])
task2("count_substring", "s, sub",
      "Return how many times the non-empty string sub occurs in s, counting overlapping occurrences\n"
      "(so 'aa' occurs twice in 'aaa').",
      "return sum(1 for i in range(len(s) - len(sub) + 1) if s[i:i + len(sub)] == sub)",
      ["assert count_substring('aaa', 'aa') == 2", "assert count_substring('banana', 'ana') == 2",
       "assert count_substring('abc', 'd') == 0", "assert count_substring('', 'a') == 0",
       "assert count_substring('abab', 'ab') == 2"])
task2("is_pangram", "s",
      "Return True if s contains every letter of the English alphabet a-z at least once, ignoring\n"
      "case, otherwise False.",
      "return set('abcdefghijklmnopqrstuvwxyz') <= set(s.lower())",
      ["assert is_pangram('The quick brown fox jumps over the lazy dog') is True", "assert is_pangram('') is False",
       "assert is_pangram('abcdefghijklmnopqrstuvwxy') is False",
       "assert is_pangram('ABCDEFGHIJKLMNOPQRSTUVWXYZ') is True"])
task2("median", "nums",
      "Return the median of the non-empty number list nums: the middle value of the sorted numbers\n"
      "if there is an odd count, otherwise the mean of the two middle values.",
      "s = sorted(nums)\nm = len(s) // 2\nreturn s[m] if len(s) % 2 == 1 else (s[m - 1] + s[m]) / 2",
      ["assert median([3, 1, 2]) == 2", "assert median([4, 1, 3, 2]) == 2.5", "assert median([5]) == 5",
       "assert median([1, 1, 2, 8]) == 1.5"])
task2("diagonal_sum", "matrix",
      "Return the sum matrix[0][0] + matrix[1][1] + ... of the main diagonal of the square matrix\n"
      "given as a list of rows (0 for an empty matrix).",
      "return sum(matrix[i][i] for i in range(len(matrix)))",
      ["assert diagonal_sum([[1, 2], [3, 4]]) == 5", "assert diagonal_sum([]) == 0", "assert diagonal_sum([[7]]) == 7",
       "assert diagonal_sum([[1, 0, 0], [0, 2, 0], [0, 0, 3]]) == 6"])
task2("is_rotation", "a, b",
      "Return True if the string b can be obtained from the string a by moving some number of\n"
      "characters (possibly none) from the start of a to its end, otherwise False.",
      "return len(a) == len(b) and b in a + a",
      ["assert is_rotation('abcde', 'cdeab') is True", "assert is_rotation('abc', 'acb') is False",
       "assert is_rotation('', '') is True", "assert is_rotation('ab', 'aba') is False",
       "assert is_rotation('abc', 'abc') is True"])
task2("snake_to_camel", "s",
      "Convert s, a snake_case name (lower-case words joined by single underscores), to camelCase:\n"
      "the first word stays as it is and each later word gets its first letter in upper case.",
      "parts = s.split('_')\nreturn parts[0] + ''.join(p[:1].upper() + p[1:] for p in parts[1:])",
      ["assert snake_to_camel('hello_world') == 'helloWorld'", "assert snake_to_camel('x') == 'x'",
       "assert snake_to_camel('get_http_response') == 'getHttpResponse'", "assert snake_to_camel('') == ''"])
task2("longest_run", "items",
      "Return the length of the longest run of consecutive equal elements in items (0 for an empty list).",
      "best = 0\ncur = 0\nfor i, x in enumerate(items):\n    cur = cur + 1 if i > 0 and x == items[i - 1] else 1\n"
      "    best = max(best, cur)\nreturn best",
      ["assert longest_run([1, 1, 2, 2, 2, 1]) == 3", "assert longest_run([]) == 0", "assert longest_run([5]) == 1",
       "assert longest_run(['a', 'b', 'a']) == 1"])
task2("top_k", "nums, k",
      "Return a list of the k largest numbers of nums in descending order, repeated values included\n"
      "(all of nums, descending, if it has fewer than k elements; [] if k <= 0).",
      "return sorted(nums, reverse=True)[:max(k, 0)]",
      ["assert top_k([3, 1, 4, 1, 5], 2) == [5, 4]", "assert top_k([2, 2, 1], 2) == [2, 2]",
       "assert top_k([1], 3) == [1]", "assert top_k([1, 2], 0) == []"])
task2("sum_of_unique", "nums", "Return the sum of the values that occur exactly once in nums (0 if there are none).",
      "return sum(x for x in nums if nums.count(x) == 1)",
      ["assert sum_of_unique([1, 2, 2, 3]) == 4", "assert sum_of_unique([]) == 0", "assert sum_of_unique([5, 5]) == 0",
       "assert sum_of_unique([-1, 4]) == 3"])
task2("reverse_number", "n",
      "Return the integer whose decimal digits are those of the non-negative integer n in reverse\n"
      "order; leading zeros of the result are dropped (120 gives 21).",
      "return int(str(n)[::-1])",
      ["assert reverse_number(123) == 321", "assert reverse_number(120) == 21", "assert reverse_number(0) == 0",
       "assert reverse_number(7) == 7"])
task2("sum_of_multiples", "n",
      "Return the sum of all positive integers below n that are multiples of 3 or 5 (0 if there are none).",
      "return sum(i for i in range(1, n) if i % 3 == 0 or i % 5 == 0)",
      ["assert sum_of_multiples(10) == 23", "assert sum_of_multiples(1) == 0", "assert sum_of_multiples(16) == 60",
       "assert sum_of_multiples(6) == 8", "assert sum_of_multiples(0) == 0"])
task2("find_duplicates", "items",
      "Return a sorted list of the distinct values that occur more than once in items.",
      "return sorted(set(x for x in items if items.count(x) > 1))",
      ["assert find_duplicates([1, 2, 2, 3, 3, 3]) == [2, 3]", "assert find_duplicates([]) == []",
       "assert find_duplicates([1, 2]) == []", "assert find_duplicates(['b', 'a', 'b', 'a']) == ['a', 'b']"])
task2("group_by_length", "words",
      "Return a dict mapping each string length that occurs in words to the list of the strings in\n"
      "words with that length, in their original order ({} for an empty list).",
      "d = {}\nfor w in words:\n    d.setdefault(len(w), []).append(w)\nreturn d",
      ["assert group_by_length(['a', 'bb', 'c']) == {1: ['a', 'c'], 2: ['bb']}", "assert group_by_length([]) == {}",
       "assert group_by_length(['xy', 'xy']) == {2: ['xy', 'xy']}"])


def check(tasks):
    """Every reference solution passes every one of its tests (each test on its own)."""
    bad = []
    for t in tasks:
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


def write_jsonl(tasks, name):
    """Writes tasks, one JSON object a line, to data/<name> atomically (temp file, fsync, rename)."""
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", name)
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(out), delete=False) as f:
        for t in tasks:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(f.name, out)


def main():
    split()
    ids = [t["id"] for t in TASKS + HELDOUT2_TASKS]
    assert len(ids) == len(set(ids)), "duplicate task ids"
    assert len(HELDOUT2_TASKS) == HELDOUT2, len(HELDOUT2_TASKS)
    check(TASKS + HELDOUT2_TASKS)
    write_jsonl(TASKS, "easy_python.jsonl")
    write_jsonl(HELDOUT2_TASKS, "easy_python_heldout2.jsonl")
    n_h = sum(1 for t in TASKS if "heldout" in t["tags"])
    print(f"wrote {len(TASKS)} tasks ({len(TASKS) - n_h} train, {n_h} heldout) to data/easy_python.jsonl")
    print(f"wrote {len(HELDOUT2_TASKS)} tasks (all heldout2) to data/easy_python_heldout2.jsonl")


if __name__ == "__main__":
    main()

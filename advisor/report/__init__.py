"""The pre-purchase planning report: `advisor report MODEL.py -o plan.html|plan.md`."""

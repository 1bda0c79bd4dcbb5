package cliutil

import (
	"slices"
	"testing"
)

func TestSplitNodes(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{"pg1=postgres://h1/app"}, []string{"pg1=postgres://h1/app"}},
		{[]string{"pg1=postgres://app@h1:5432,h2:5432/app?target_session_attrs=read-write"},
			[]string{"pg1=postgres://app@h1:5432,h2:5432/app?target_session_attrs=read-write"}},
		{[]string{"pg1=postgres://h1/app,pg2=postgres://h2/app", "pg3=postgres://h3/app"},
			[]string{"pg1=postgres://h1/app", "pg2=postgres://h2/app", "pg3=postgres://h3/app"}},
		{[]string{"a=postgres://h1,h2/app, b_2=POSTGRESQL://h3,[::1]:5/app?x=1,2,c.d=postgres://h4/app"},
			[]string{"a=postgres://h1,h2/app", "b_2=POSTGRESQL://h3,[::1]:5/app?x=1,2", "c.d=postgres://h4/app"}},
		// Not a node's start: stays in the value, for validation to refuse.
		{[]string{"pg1=postgres://h1/app,h2=mysql://h2/app"}, []string{"pg1=postgres://h1/app,h2=mysql://h2/app"}},
	} {
		if got := SplitNodes(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("SplitNodes(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

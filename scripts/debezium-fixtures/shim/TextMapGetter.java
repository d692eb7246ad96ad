// The wheel pairs opentelemetry-api 1.62 with opentelemetry-context 1.47, whose TextMapGetter
// lacks getAll, which api 1.62's W3C propagators call. generate.sh compiles this interface
// ahead of the wheel's jars on the class path, with getAll as later opentelemetry-context
// versions define it (the values of one key: here the one get returns), so the propagators
// run as they would with matching jars.
package io.opentelemetry.context.propagation;

import java.util.Collections;
import java.util.Iterator;

public interface TextMapGetter<C> {
    Iterable<String> keys(C carrier);

    String get(C carrier, String key);

    default Iterator<String> getAll(C carrier, String key) {
        String value = get(carrier, key);
        return value == null ? Collections.emptyIterator() : Collections.singletonList(value).iterator();
    }
}
